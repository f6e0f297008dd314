"""The timeline page's HTML, CSS and script: one self-contained file, nothing fetched at view time.

`_timeline` fills in the data (a JSON document in a script element); the
script draws the events on a time axis, coloured by health, and shows the
context the model saw as of the event picked with the slider or a click
(rebuilt from the stored changes), with the change from the event before,
and the summary as of that event with its line diff from the one before.
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
  .panes { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-bottom: 12px; }
  .note { color: #6b7282; font-size: 12px; margin: 0 0 6px; }
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
  <div class="pane"><h2>Summary as of this event</h2><p class="note" id="summary-note"></p>
    <pre id="summary-diff"></pre></div>
</main>
<script id="data" type="application/json">__DATA__</script>
<script>
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("data").textContent);
  const lines = data.lines, chunks = data.chunks, rows = data.events, every = data.checkpoint;
  const linesOf = (ids) => ids.flatMap((id) => chunks[id]);
  const ev = (i) => {
    const r = rows[i];
    return {position: r[0], seq: r[1], at: r[2], time: r[3], type: r[4], detail: r[5], health: r[6]};
  };
  const el = (id) => document.getElementById(id);
  el("key").textContent = data.key;
  el("summary").textContent = rows.length + " events, " + data.first + " to " + data.last + " (UTC)";
  const slider = el("slider");
  slider.max = String(rows.length - 1);
  const axis = el("axis");
  const t0 = rows[0][2] || 0, t1 = rows[rows.length - 1][2] || t0;
  const span = Math.max(t1 - t0, 1e-9);
  const place = (i) => {
    const at = rows[i][2];
    const byTime = at === null ? i / Math.max(rows.length - 1, 1) : (at - t0) / span;
    return 2 + 96 * byTime;
  };
  const evictions = ["backlog.trimmed", "session.cleared", "history.compacted"];
  const marks = [];
  for (let i = 0; i < rows.length; i++) {
    const e = ev(i);
    const mark = document.createElement("div");
    mark.className = "mark " + e.health + (e.type === "summary.produced" ? " summary" : "") +
      (evictions.includes(e.type) ? " eviction" : "");
    mark.style.left = place(i) + "%";
    mark.title = "position " + e.position + ": " + e.type;
    mark.addEventListener("click", () => show(i));
    marks.push(mark);
  }
  axis.append(...marks);
  for (let i = 0; i < rows.length;) {  // health as coloured bands over time, one a run
    let j = i;
    while (j + 1 < rows.length && rows[j + 1][6] === rows[i][6]) j++;
    const band = document.createElement("div");
    const left = place(i), right = j + 1 < rows.length ? place(j + 1) : 98;
    band.className = "band " + rows[i][6];
    band.style.left = left + "%";
    band.style.width = Math.max(right - left, 0.3) + "%";
    axis.appendChild(band);
    i = j + 1;
  }
  const apply = (before, ops) => {
    if (ops === null) return before;
    const after = [];
    for (const op of ops) {
      if (Array.isArray(op)) { for (let k = op[0]; k < op[1]; k++) after.push(before[k]); }
      else after.push(op);
    }
    return after;
  };
  let cached = {at: -1, ids: []};
  const contextAt = (i) => {  // chunk ids of the context after event i: the nearest whole one, then changes
    if (i < 0) return [];
    if (cached.at === i) return cached.ids;
    let at = i - (i % every), ids = data.whole[String(at)];
    if (cached.at >= at && cached.at < i) { at = cached.at; ids = cached.ids; }
    for (let k = at + 1; k <= i; k++) ids = apply(ids, data.context[k]);
    cached = {at: i, ids: ids};
    return ids;
  };
  const changes = Object.keys(data.summaries).map(Number).sort((a, b) => a - b);
  const lastChange = (i) => {  // the latest event at or before i that changed the summary, or -1
    let lo = 0, hi = changes.length - 1, found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (changes[mid] <= i) { found = changes[mid]; lo = mid + 1; } else hi = mid - 1;
    }
    return found;
  };
  const text = (parent, cls, line) => {
    const span = document.createElement("span");
    span.className = cls;
    span.textContent = line;
    parent.appendChild(span);
  };
  const kept = (parent, ids) => {  // unchanged lines: a few shown, a long run counted
    if (ids.length <= 4) { ids.forEach((id) => text(parent, "same", lines[id])); return; }
    text(parent, "same", lines[ids[0]]);
    text(parent, "same", "\\u2026 " + (ids.length - 2) + " unchanged lines \\u2026");
    text(parent, "same", lines[ids[ids.length - 1]]);
  };
  function showDiff(i) {
    const diff = el("diff");
    diff.replaceChildren();
    const ops = data.context[i];
    if (ops === null) { text(diff, "same", "(no change to the context)"); return; }
    const before = contextAt(i - 1);
    let cursor = 0;
    const each = (cls, ids) => linesOf(ids).forEach((id) => text(diff, cls, lines[id]));
    for (const op of ops) {
      if (Array.isArray(op)) {
        each("del", before.slice(cursor, op[0]));
        kept(diff, linesOf(before.slice(op[0], op[1])));
        cursor = op[1];
      } else each("add", [op]);
    }
    each("del", before.slice(cursor));
  }
  function showSummary(i) {
    const pane = el("summary-diff"), note = el("summary-note");
    pane.replaceChildren();
    const at = lastChange(i);
    if (at < 0) { note.textContent = "no summary yet"; return; }
    const tagged = data.summaries[String(at)];
    const count = (tag) => tagged.filter((t) => t[0] === tag).length;
    const now = tagged.filter((t) => t[0] !== "-").length;
    if (at === i) {
      note.textContent = now ? "this event's summary: " + count("+") + " lines added, " + count(" ") +
        " kept, " + count("-") + " dropped from the summary before" : "this event cleared the summary";
      tagged.forEach((t) => text(pane, t[0] === "+" ? "add" : t[0] === "-" ? "del" : "same", lines[t[1]]));
    } else {
      note.textContent = now ? "unchanged since position " + rows[at][0] : "no summary since position " +
        rows[at][0];
      tagged.filter((t) => t[0] !== "-").forEach((t) => text(pane, "same", lines[t[1]]));
    }
  }
  let selected = -1;
  function show(i) {
    i = Math.max(0, Math.min(rows.length - 1, i));
    slider.value = String(i);
    if (selected >= 0) marks[selected].classList.remove("selected");
    marks[i].classList.add("selected");
    selected = i;
    const e = ev(i);
    el("where").textContent = "event " + (i + 1) + " of " + rows.length + ", position " + e.position;
    const box = el("event");
    box.replaceChildren();
    const head = document.createElement("div");
    const seq = e.seq === null ? "-" : e.seq;
    text(head, "", ["position " + e.position, "seq " + seq, e.time || "-", e.type, "health " + e.health]
      .join(" \\u00b7 "));
    box.appendChild(head);
    text(box, "", e.detail);
    el("context").textContent = linesOf(contextAt(i)).map((id) => lines[id]).join("\\n");
    showDiff(i);
    showSummary(i);
    document.body.dataset.position = String(e.position);
  }
  slider.addEventListener("input", () => show(Number(slider.value)));
  el("prev").addEventListener("click", () => show(Number(slider.value) - 1));
  el("next").addEventListener("click", () => show(Number(slider.value) + 1));
  document.addEventListener("keydown", (e) => {
    if (e.target === slider) return;  // the slider steps itself (and says so with an input event)
    if (e.key === "ArrowLeft") show(Number(slider.value) - 1);
    if (e.key === "ArrowRight") show(Number(slider.value) + 1);
  });
  show(rows.length - 1);
})();
</script>
</body>
</html>
"""
