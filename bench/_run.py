"""The command line: run the measures, print the table, write the JSON."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from bench._common import FULL, SMOKE, Result, exit_on_sigterm
from bench._report import document, table, write_json

__all__ = ["MEASURES", "ON_DEMAND", "main"]

MEASURES = (
    "throughput",
    "latency",
    "context",
    "replay",
    "activation",
    "scale",
    "quality",
    "dropin",
    "erasure",
    "peers",
    "workers",
    "cores",
    "summarizer_latency",
    "history",
    "fairness",
    "encryption",
    "retention",
)
ON_DEMAND = ("chaos",)
"""Measures run only when named in ``--only`` (minutes long, they kill processes): not in the default run."""
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="convmem's benchmarks, each measured side by side with its reference in one run.",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: every figure in seconds (for CI)")
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated measures to run (default all: {','.join(MEASURES)}; "
        f"on demand only: {','.join(ON_DEMAND)})",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the JSON goes (default bench/out/)")
    parser.add_argument(
        "--no-profile", action="store_true", help="skip the profiles taken when a figure misses its target"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_sigterm()
    args = _parse(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(MEASURES)
    unknown = [n for n in names if n not in MEASURES + ON_DEMAND]
    if unknown:
        choices = ", ".join(MEASURES + ON_DEMAND)
        print(f"unknown measure(s): {', '.join(unknown)}; choose from {choices}", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    sizes = dataclasses.replace(
        SMOKE if args.smoke else FULL,
        out_dir=str(out_dir),
        profile=not args.no_profile and not args.smoke,
    )
    logging.basicConfig(level=logging.ERROR)  # convmem warns on purpose in some runs (a hung summarizer)
    started = datetime.now().astimezone()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Result] = {}
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
            results[name] = module.run(sizes)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            results[name] = Result(skipped=f"failed: {errors[name]}")
        seconds[name] = time.perf_counter() - began
        print(f"   {name}: {seconds[name]:.1f}s", file=sys.stderr, flush=True)
    doc = document(
        results,
        mode="smoke" if args.smoke else "full",
        started=started,
        seconds=seconds,
        errors=errors,
        load_at_start=load_at_start,
    )
    path = write_json(doc, out_dir, started)
    print(table(results))
    for name, result in results.items():
        for note in result.notes:
            print(f"- {name}: {note}")
    print(f"\nJSON: {path} (and {out_dir / 'latest.json'})")
    return 1 if errors else 0
