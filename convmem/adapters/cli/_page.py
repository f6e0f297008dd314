"""The timeline page's HTML, CSS and script: one self-contained file, nothing fetched at view time.

`_timeline` fills in the data (a JSON document in a script element); the
script draws the events on a time axis, coloured by health, and shows the
context the model saw as of the event picked with the slider or a click,
with the change from the event before.
"""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'; img-src data:">
<title>convmem timeline: __TITLE__</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { padding: 14px 20px; background: #1d2330; color: #fff; }
  header h1 { font-size: 17px; margin: 0 0 4px; }
  header p { margin: 0; color: #c5cad6; font-size: 13px; }
  main { padding: 14px 20px; }
  #axis { position: relative; height: 64px; background: #fff; border: 1px solid #d9dce3;
          border-radius: 6px; margin-bottom: 8px; }
  #axis .band { position: absolute; top: 0; height: 10px; }
  .mark { position: absolute; top: 20px; width: 12px; height: 24px; margin-left: -6px; border-radius: 3px;
          cursor: pointer; border: 2px solid transparent; box-sizing: border-box; }
  .mark.summary::after { content: "\\25C6"; position: absolute; top: -17px; left: -1px; font-size: 11px;
          color: #6a3fb5; }
  .mark.eviction::after { content: "\\2715"; position: absolute; top: -17px; left: 0; font-size: 11px;
          color: #b5473f; }
  .mark.selected { border-color: #1d2330; transform: scaleY(1.2); }
  .healthy { background: #3d9a5b; } .retry { background: #e0a030; } .degraded { background: #c94a3f; }
  .recovering { background: #3f7fc9; } .unknown { background: #9aa1ad; }
  #controls { display: flex; gap: 12px; align-items: center; margin-bottom: 12px; }
  #slider { flex: 1; }
  #legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
  #legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
  #event { background: #fff; border: 1px solid #d9dce3; border-radius: 6px; padding: 10px 14px;
           margin-bottom: 12px; }
  #event b { font-family: ui-monospace, monospace; }
  .panes { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
  .pane { background: #fff; border: 1px solid #d9dce3; border-radius: 6px; padding: 10px 14px; min-width: 0; }
  .pane h2 { font-size: 14px; margin: 0 0 8px; }
  pre { font: 12px/1.45 ui-monospace, monospace; white-space: pre-wrap; word-break: break-word; margin: 0; }
  .add { background: #e3f5e8; color: #17602e; display: block; }
  .del { background: #fbe4e2; color: #8c2a22; display: block; text-decoration: line-through; }
  .same { color: #6b7282; display: block; }
</style>
</head>
<body>
<header>
  <h1>Session <span id="key"></span></h1>
  <p id="summary"></p>
</header>
<main>
  <div id="axis"></div>
  <div id="controls">
    <button id="prev" type="button">&larr;</button>
    <input id="slider" type="range" min="0" value="0" step="1">
    <button id="next" type="button">&rarr;</button>
    <span id="where"></span>
  </div>
  <div id="legend">
    <span><i class="healthy"></i>healthy</span><span><i class="retry"></i>retry</span>
    <span><i class="degraded"></i>degraded</span><span><i class="recovering"></i>recovering</span>
    <span>&#9670; summary</span><span>&#10005; eviction (backlog trimmed, cleared, compacted)</span>
  </div>
  <div id="event"></div>
  <div class="panes">
    <div class="pane"><h2>Context the model saw as of this event</h2><pre id="context"></pre></div>
    <div class="pane"><h2>Change from the previous event</h2><pre id="diff"></pre></div>
  </div>
</main>
<script id="data" type="application/json">__DATA__</script>
<script>
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("data").textContent);
  const events = data.events;
  const el = (id) => document.getElementById(id);
  el("key").textContent = data.key;
  el("summary").textContent = events.length + " events, " + data.first + " to " + data.last + " (UTC)";
  const slider = el("slider");
  slider.max = String(events.length - 1);
  const axis = el("axis");
  const t0 = events[0].at || 0, t1 = events[events.length - 1].at || t0;
  const span = Math.max(t1 - t0, 1e-9);
  const place = (i) => {
    const at = events[i].at;
    const byTime = at === null ? i / Math.max(events.length - 1, 1) : (at - t0) / span;
    return 2 + 96 * byTime;
  };
  const marks = events.map((ev, i) => {
    const mark = document.createElement("div");
    mark.className = "mark " + ev.health + (ev.type === "summary.produced" ? " summary" : "") +
      (ev.type === "backlog.trimmed" || ev.type === "session.cleared" || ev.type === "history.compacted"
        ? " eviction" : "");
    mark.style.left = place(i) + "%";
    mark.title = "position " + ev.position + ": " + ev.type;
    mark.dataset.index = String(i);
    mark.addEventListener("click", () => show(i));
    axis.appendChild(mark);
    return mark;
  });
  for (let i = 0; i < events.length; i++) {  // health as coloured bands over time
    const band = document.createElement("div");
    const left = place(i), right = i + 1 < events.length ? place(i + 1) : 98;
    band.className = "band " + events[i].health;
    band.style.left = left + "%";
    band.style.width = Math.max(right - left, 0.3) + "%";
    axis.appendChild(band);
  }
  const text = (parent, cls, line) => {
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = line;
    parent.appendChild(span);
  };
  function show(i) {
    i = Math.max(0, Math.min(events.length - 1, i));
    slider.value = String(i);
    marks.forEach((m, j) => m.classList.toggle("selected", j === i));
    const ev = events[i];
    el("where").textContent = "event " + (i + 1) + " of " + events.length + ", position " + ev.position;
    const box = el("event");
    box.replaceChildren();
    const head = document.createElement("div");
    const seq = ev.seq === null ? "-" : ev.seq;
    text(head, "", ["position " + ev.position, "seq " + seq, ev.time || "-", ev.type, "health " + ev.health]
      .join(" \\u00b7 "));
    box.appendChild(head);
    text(box, "", ev.detail);
    el("context").textContent = ev.context;
    const diff = el("diff");
    diff.replaceChildren();
    if (!ev.diff.length) { text(diff, "same", "(no change to the context)"); }
    ev.diff.forEach((d) => text(diff, d[0] === "+" ? "add" : d[0] === "-" ? "del" : "same", d.slice(2)));
    document.body.dataset.position = String(ev.position);
  }
  slider.addEventListener("input", () => show(Number(slider.value)));
  el("prev").addEventListener("click", () => show(Number(slider.value) - 1));
  el("next").addEventListener("click", () => show(Number(slider.value) + 1));
  document.addEventListener("keydown", (e) => {
    if (e.key === "ArrowLeft") show(Number(slider.value) - 1);
    if (e.key === "ArrowRight") show(Number(slider.value) + 1);
  });
  show(events.length - 1);
})();
</script>
</body>
</html>
"""
