"""Fair shares vs CPU: another tenant's latency while one tenant sends legal but CPU-expensive requests.

    python -m bench.cpu_fairness [--out FILE] [--op context] [--window 8] [--rounds 3] [--turns 1000]

One nats-server (store on tmpfs when there is room) and one `convmem serve
--workers 1` with the recommended configuration (``recommended(4000)``:
recall on, 1,000 live turns) and the default quotas. Tenant ``heavy``'s
sessions each get TURNS turns first. Then rounds alternate: tenant
``victim`` (this process) writes turns one after another and reads its
context with a short query, timing each, with no other load, then under
tenant ``heavy``'s load (`bench._heavy`, another process: WINDOW requests
in flight, within its ``max_running``, each a ``context`` with a query of
8,000 characters, or OP). The figures: the victim's add_turn and context
p50/p99 each way, and the serve worker's CPU seconds per heavy request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import LoadProcess, memory_store_root, nats_server, percentile, sample_turn, write_json
from convmem.adapters import RemoteMemory
from convmem.adapters.frontends.service import _shares
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX
from convmem.adapters.frontends.service._status import service_status
from convmem.events import MemoryKey


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(
    url: str, folder: Path, switch: float | None, cpu_share: float | None
) -> tuple[subprocess.Popen[bytes], int]:
    ready = folder / "ready"
    err = open(folder / "serve.err", "ab")  # noqa: SIM115
    env = dict(os.environ)
    lines = ["import sys"]
    if switch is not None:
        lines.append(f"sys.setswitchinterval({switch})")
    if cpu_share is not None:  # 1e9: requests counted only, not weighed (as before CPU_SHARE)
        lines.append(f"import convmem.adapters.frontends.service._shares as s; s.CPU_SHARE = {cpu_share}")
    if len(lines) > 1:  # every process of the serve (its workers are spawned) runs it at start
        site = folder / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "convmem",
            "--nats",
            url,
            "serve",
            "--workers",
            "1",
            "--max-live-sessions",
            "100000",
            "--ready-file",
            str(ready),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    pause = threading.Event()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((folder / "serve.err").read_text()[-2000:])
        if ready.exists():
            found = asyncio.run(service_status(url, api_prefix=DEFAULT_API_PREFIX, discover=0.5))
            pids = [
                int(r.health["worker"]["pid"]) for r in found if r.ok and r.health and "worker" in r.health
            ]
            if pids:
                return proc, pids[0]
        pause.wait(0.1)
    proc.kill()
    raise RuntimeError("serve did not start")


class _Heavy(LoadProcess):
    """Tenant A's process: its expensive requests always in flight until `stop`, which returns its counts."""

    def __init__(self, url: str, window: int, op: str, chars: int, sessions: int) -> None:
        args = [url, "heavy", str(window), op, str(chars), str(sessions)]
        super().__init__("bench._heavy", args, phase="loading")


def _victim(remote: RemoteMemory, key: MemoryKey, count: int, first: int) -> dict[str, list[float]]:
    session = remote.session(key)
    took: dict[str, list[float]] = {"add_turn": [], "context": []}
    for n in range(first, first + count):
        began = time.perf_counter()
        session.add_turn(sample_turn(n))
        took["add_turn"].append(time.perf_counter() - began)
        began = time.perf_counter()
        session.get_llm_context(query="what about the invoice from Lyon?")
        took["context"].append(time.perf_counter() - began)
    return took


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
    }


def _phase(
    args: argparse.Namespace, url: str, pid: int, remote: RemoteMemory, key: MemoryKey, done: int, heavy: bool
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """The victim's times over one phase (under the heavy tenant's load when `heavy`), and its row."""
    load = _Heavy(url, args.window, args.op, args.chars, args.sessions) if heavy else None
    cpu0, t0 = _cpu(pid), time.perf_counter()
    try:
        times = _victim(remote, key, args.writes, done)
    finally:
        counts = load.stop() if load is not None else None
    cpu, wall = _cpu(pid) - cpu0, time.perf_counter() - t0
    row: dict[str, Any] = {op: _ms(v) for op, v in times.items()}
    row["serve_cpu_s"] = round(cpu, 2)
    row["wall_s"] = round(wall, 2)
    if counts is not None:
        row["heavy"] = counts
    return times, row


def _alone(args: argparse.Namespace, url: str, pid: int, filled: float) -> int:
    """The heavy tenant's requests/s and the serve's CPU over `args.alone` seconds with no other tenant."""
    load = _Heavy(url, args.window, args.op, args.chars, args.sessions)
    cpu0 = _cpu(pid)
    threading.Event().wait(args.alone)
    counts = load.stop()
    result = {
        "alone_s": args.alone,
        "cpu_share": args.cpu_share if args.cpu_share is not None else _shares.CPU_SHARE,
        "op": args.op,
        "chars": args.chars,
        "window": args.window,
        "fill_s": round(filled, 1),
        "heavy": counts,
        "per_s": round(counts["answered"] / counts["seconds"], 1),
        "serve_cpu_s": round(_cpu(pid) - cpu0, 2),
        "load": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=1))
    write_json(args.out, result)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--op", default="context")
    parser.add_argument("--chars", type=int, default=8000)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writes", type=int, default=150)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument(
        "--switch-interval", type=float, help="the serve's sys.setswitchinterval (default 0.005)"
    )
    parser.add_argument("--cpu-share", type=float, help="the serve's CPU_SHARE (1e9: no CPU weighing)")
    parser.add_argument(
        "--alone", type=float, help="seconds of the heavy tenant alone (no victim at all): its requests/s"
    )
    args = parser.parse_args()
    took: dict[str, dict[str, list[float]]] = {
        "quiet": {"add_turn": [], "context": []},
        "heavy": {"add_turn": [], "context": []},
    }
    rounds: list[dict[str, Any]] = []
    with (
        nats_server(None, store_root=memory_store_root()) as server,
        tempfile.TemporaryDirectory(prefix="convmem-cpuf-") as folder,
    ):
        proc, pid = _serve(server.url, Path(folder), args.switch_interval, args.cpu_share)
        try:
            with RemoteMemory(server.url, timeout=60.0) as remote:
                began = time.perf_counter()
                for s in range(args.sessions):
                    session = remote.session(MemoryKey("heavy", "heavy", f"s{s}"))
                    for n in range(args.turns):
                        session.add_turn(sample_turn(n, user_words=40, assistant_words=120))
                filled = time.perf_counter() - began
                if args.alone is not None:  # no other tenant ever asks: the heavy one is alone
                    return _alone(args, server.url, pid, filled)
                key = MemoryKey("victim", "u", "chat")
                done = 20
                _victim(remote, key, done, 0)
                for r in range(args.rounds):
                    row: dict[str, Any] = {"round": r}
                    for phase in ("quiet", "heavy"):
                        times, row[phase] = _phase(args, server.url, pid, remote, key, done, phase == "heavy")
                        done += args.writes
                        for op, values in times.items():
                            took[phase][op] += values
                    # The serve's CPU a heavy request, less what the victim's own requests cost it (as quiet).
                    extra = row["heavy"]["serve_cpu_s"] - row["quiet"]["serve_cpu_s"]
                    ok = max(row["heavy"]["heavy"]["counts"].get("ok", 0), 1)
                    row["heavy"]["serve_cpu_ms_per_heavy_request"] = round(extra * 1000 / ok, 1)
                    rounds.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    result = {
        "switch_interval": args.switch_interval,
        "cpu_share": args.cpu_share if args.cpu_share is not None else _shares.CPU_SHARE,
        "op": args.op,
        "chars": args.chars,
        "window": args.window,
        "turns": args.turns,
        "sessions": args.sessions,
        "fill_s": round(filled, 1),
        "pooled": {phase: {op: _ms(v) for op, v in ops.items()} for phase, ops in took.items()},
        "ratio_p99": {
            op: round(percentile(took["heavy"][op], 99) / percentile(took["quiet"][op], 99), 1)
            for op in ("add_turn", "context")
        },
        "rounds": rounds,
        "load": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=1))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
