"""The timeline page at scale: build time, file size and peak memory for 1,000 and 10,000 turns.

Run: ``python -m bench.timeline_scale [--sizes 1000,10000] [--rounds 2] [--out FILE]``.
Each case runs in a fresh process (so its peak RSS is its own): a session of
N turns is written to the in-memory log (``memory://``), with a summarizer
that keeps up (``healthy``: a flush every 10 turns, so a summary about every
tenth turn) or one that always fails (``down``: no summary ever, so the
context holds every turn not yet evicted), and then `timeline_page` builds
the page. Only the page's build is timed; the RSS before it (the session and
the interpreter) is reported beside the peak. The cases alternate within
each round. Not part of ``python -m bench``: no CI gate, a measure for the
README and RESULTS.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import convmem
from convmem.adapters.frontends.cli._timeline import timeline_page
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

KEY = MemoryKey("bench", "auditor", "long")


def _keeps_up(request: Mapping[str, Any]) -> dict[str, str]:
    before = request["previous_summary"].split("\n")[1:-1][-12:]
    said = [f"- asked: {t['user'][:50]}" for t in request["turns"]]
    return {"summary": "\n".join(["<session_summary>", *before, *said, "</session_summary>"])}


def _down(request: Mapping[str, Any]) -> dict[str, str]:
    raise ConnectionError("summarizer endpoint unreachable")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def one(turns: int, summarizer: str) -> dict[str, Any]:
    """Build one session and time its page (in this process)."""
    config = ShortTermMemoryConfig(strategy="rolling_summary")
    chosen = _keeps_up if summarizer == "healthy" else _down
    with convmem.connect("memory://", config=config, summarizer=chosen) as memory:
        session = memory.session(KEY)
        for i in range(turns):
            session.add_turn(
                ConversationTurn(
                    user_message=f"Turn {i}: what about day {i % 9} of the trip?\nAnd the budget for it?",
                    assistant_response=f"Day {i % 9} (turn {i}): a walk in Alfama.\nBudget: EUR {100 + i}.",
                )
            )
            if summarizer == "healthy" and i % 10 == 9:
                session.flush(timeout=60)
        records = list(memory.log.read(KEY))
    before = _rss_mb()
    started = time.perf_counter()
    page = timeline_page(records, KEY)
    seconds = time.perf_counter() - started
    return {
        "turns": turns,
        "summarizer": summarizer,
        "events": len(records),
        "build_s": round(seconds, 2),
        "page_mb": round(len(page.encode("utf-8")) / 1e6, 3),
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("TURNS", "SUMMARIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1])))
        return 0
    cases = [(int(n), s) for n in args.sizes.split(",") for s in ("healthy", "down")]
    runs = []
    for round_ in range(args.rounds):
        for turns, summarizer in cases if round_ % 2 == 0 else cases[::-1]:
            done = subprocess.run(
                [sys.executable, "-m", "bench.timeline_scale", "--one", str(turns), summarizer],
                check=True,
                capture_output=True,
                text=True,
            )
            result = {"round": round_, **json.loads(done.stdout)}
            print(json.dumps(result), file=sys.stderr)
            runs.append(result)
    document = {
        "measure": "timeline page build",
        "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}",
        "runs": runs,
    }
    text = json.dumps(document, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
