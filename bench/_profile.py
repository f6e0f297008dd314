"""Profiles of what misses its target: py-spy on this process, summarised per thread and frame.

A profile is taken in an extra pass after the measured one (py-spy takes CPU
of its own, so it never runs while a figure is timed). It samples only the
thread holding the GIL (``--gil``): where this process spends its Python CPU,
not where its threads wait. The raw samples are
written beside the JSON; the summary (where each thread spends its samples,
and the frames with the most samples of their own) goes into the JSON.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["py_spy", "summarise"]


def _binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


@contextlib.contextmanager
def py_spy(out_dir: str, name: str, details: dict[str, Any]) -> Iterator[None]:
    """Sample this process while the block runs; put the summary in `details[name]`."""
    binary = _binary()
    if binary is None:
        details[name] = {"error": "py-spy is not installed (pip install py-spy)"}
        yield
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"profile-{name}.txt"
    spy = subprocess.Popen(
        [
            *(
                binary,
                "record",
                "--pid",
                str(os.getpid()),
                "--rate",
                "200",
                "--format",
                "raw",
                "--threads",
                "--gil",
            ),
            *("--nonblocking", "--duration", "600", "--output", str(raw)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        if raw.exists():
            details[name] = {"file": str(raw), **summarise(raw)}
        else:
            details[name] = {"error": f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}"}


def summarise(raw: Path, top: int = 25) -> dict[str, Any]:
    """Samples per thread, and the frames (function, file:line) with the most samples of their own."""
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        n = int(count)
        thread = frames[0].split(":", 1)[-1].strip() if frames[0].startswith("thread") else "?"
        threads[_thread_group(thread)] += n
        own[frames[-1]] += n
        for frame in set(frames[1:]):
            functions[frame.split(" (")[0]] += n
    total = sum(threads.values()) or 1
    return {
        "samples": total,
        "threads_share": {k: round(v / total, 3) for k, v in threads.most_common(10)},
        "own_time_share": [(frame, round(n / total, 3)) for frame, n in own.most_common(top)],
        "inclusive_share": [(fn, round(n / total, 3)) for fn, n in functions.most_common(top)],
    }


def _thread_group(name: str) -> str:
    """Thread names without their numbers, so 1,000 session actors count as one group."""
    name = name.strip("() ")
    for prefix in ("SessionActor", "convmem-callback", "convmem-summarizer", "Thread-", "ThreadPoolExecutor"):
        if prefix in name:
            return prefix
    return name
