"""The benchmark harness's smoke run: it cannot rot unnoticed (the harness itself is no test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "throughput": ["add_turn turns/s, 8 threads, 40 sessions [sync=default]", "[sync=always]"],
    "latency": [
        "p99 @ 1000/s healthy [sync=always]",
        "p99 @ 1000/s hung summarizer vs healthy",
        "p99 @ 1000/s recommended, extractive in a worker process",
        "p99 @ 1000/s healthy vs a raw nats-py JetStream publish [sync=always]",
    ],
    "context": ["SessionHandle.get_llm_context @ 100 turns", "llm_context(state), pure @ 5 turns"],
    "replay": ["JetStream read_all + decode + fold", "in memory: fold only, replay() per session"],
    "activation": ["MemorySystem.load(key) p50", "first get_llm_context of a passivated session p99"],
    "scale": ["RSS after touching 200 sessions", "40 sessions round-robin, 8 live"],
    "quality": [
        "recommended: answer recall / ceiling @ 1000 tokens, vs written summaries",
        "recommended: max context tokens @ 4000",
        "word list: grounded recall / ceiling @ 1000 tokens, all questions",
        "grounded recall of the full history (dated turns, the ceiling), all questions",
    ],
    "dropin": ["drop-in get_llm_context @ 5 turns", "drop-in add_turn (durable, embedded server, fsync)"],
    "erasure": ["erased session dropped by another process, p99", "log erase of a 11-event session"],
    "peers": [
        "writes/s @ 40 sessions, convmem, threads, fsync always, connect()'s default live bound",
        "reads/s @ 40 sessions, OpenAI Agents SQLiteSession, file",
        "reads/s @ 40 sessions, LangGraph SqliteSaver, file",
        "writes/s @ 40 sessions, PenguiFlow DefaultShortTermMemory",
        "reads/s @ 40 sessions, convmem, default live bound, vs LangGraph SqliteSaver on a file",
    ],
    "workers": ["serve --workers 2, 8 asyncio callers", "serve --workers 2, 8 threads of RemoteSession"],
    "cores": ["serve --workers 2, 2 load processes x 4 asyncio callers", "workers' CPU per durable turn"],
    "summarizer_latency": [
        "p99 @ 1000/s: worker process vs in process",
        "median burst p99 @ 1000/s, extractive in a worker process",
    ],
    "history": ["snapshot_bytes at 400 turns", "add_turn_p99_ms at 400 turns", "rss_mb at 400 turns"],
    "fairness": [
        "victim add_turn p99 under one tenant's flood vs without",
        "victim writes failed under the flood",
        "control: victim add_turn p99 while the same flood hits a trivial responder",
    ],
    "retention": ["dry-run sweep per session of", "compaction per session"],
    "encryption": [
        "durable add_turn, encrypted against plain",
        "log read_all + decode, encrypted against plain",
        "seal one TurnAdded",
    ],
}


@pytest.mark.slow
def test_smoke_run_writes_every_figure_of_every_measure(tmp_path: Path) -> None:
    """`python -m bench --smoke` exits 0 and its JSON holds every measure's figures, none failed."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,  # every measure at tiny sizes: about 4.5 min on the shared 2-core machine under load
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert doc["mode"] == "smoke"
    assert doc["machine"]["nproc"] >= 1
    assert set(doc["measures"]) == set(EXPECTED)
    for name, wanted in EXPECTED.items():
        measure = doc["measures"][name]
        assert measure["error"] is None, (name, measure["error"])
        if name == "quality" and measure["skipped"]:
            continue  # no LoCoMo data on this machine: the run says so instead of failing
        names = [f["name"] for f in measure["figures"]]
        for fragment in wanted:
            assert any(fragment in n for n in names), (name, fragment, names)
        for figure in measure["figures"]:
            assert isinstance(figure["value"], int | float), (name, figure)
    assert "measure" in done.stdout
    assert "figure" in done.stdout


@pytest.mark.slow
def test_device_script_runs_each_measure_within_its_limit(tmp_path: Path) -> None:
    """bench/device.sh (issue 28's one device call) writes each measure's JSON and the machine's
    record under $OUT, and skips what no longer fits in its overall limit rather than overrunning."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path), "DEVICE_SMOKE": "1"}
    env["DEVICE_MEASURES"] = "cores peers"
    env["DEVICE_LIMIT_CORES"] = "120"
    env["DEVICE_TOTAL"] = "30"  # cores starts with 20 s left (its limit cut to that); peers: not run
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    machine = (tmp_path / "machine.txt").read_text()
    assert "cores: limit 20s" in machine, machine
    assert "peers: not run" in machine, machine
    assert not (tmp_path / "peers.json").exists()
    if "cores: exit 0" in machine:
        figures = json.loads((tmp_path / "cores.json").read_text())["measures"]["cores"]
        assert figures["error"] is None
    else:  # the machine was too slow for 20 s: the limit stopped it, and its log says so
        assert "ran past its 20s limit" in (tmp_path / "cores.log").read_text()
