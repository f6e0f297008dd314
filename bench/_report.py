"""The machine a run was on, the side-by-side table, and the JSON files."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil

from bench._common import Result
from convmem.adapters.backends.jetstream._embedded import find_nats_server

__all__ = ["machine", "table", "write_json"]


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, memory, CPU, Python, nats-server, packages."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        cpu = platform.processor()
    try:
        binary = find_nats_server()
        nats_version = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except Exception as exc:  # the report still says why
        nats_version = f"unknown ({exc})"
    packages = {}
    peers = ("openai-agents", "langgraph", "langgraph-checkpoint-sqlite")  # the peers measure's
    for name in ("convmem", "nats-py", "msgspec", "pykka", "penguiflow", "psutil", *peers):
        try:
            packages[name] = version(name)
        except Exception:
            packages[name] = "not installed"
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "nproc": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "nats_server": nats_version,
        "packages": packages,
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(results: dict[str, Result]) -> str:
    """measure | figure | value | reference | ratio | target | met?"""
    rows = [("measure", "figure", "value", "reference", "ratio", "target", "met?")]
    for measure, result in results.items():
        if result.skipped:
            rows.append((measure, f"skipped: {result.skipped}", "", "", "", "", ""))
            continue
        for figure in result.figures:
            met = {True: "yes", False: "NO", None: "-"}[figure.met]
            rows.append(
                (
                    measure,
                    figure.name,
                    f"{_fmt(figure.value)} {figure.unit}",
                    _fmt(figure.reference),
                    _fmt(figure.ratio),
                    str(figure.target) if figure.target else "-",
                    met,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def document(
    results: dict[str, Result],
    *,
    mode: str,
    started: datetime,
    seconds: dict[str, float],
    errors: dict[str, str],
    load_at_start: list[float],
) -> dict[str, Any]:
    return {
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": mode,
        "machine": machine(),
        "load_average_at_start": load_at_start,
        "measures": {
            name: {
                "seconds": round(seconds.get(name, 0.0), 2),
                "skipped": result.skipped,
                "error": errors.get(name),
                "notes": result.notes,
                "figures": [f.to_json() for f in result.figures],
                "details": result.details,
            }
            for name, result in results.items()
        },
    }


def write_json(doc: dict[str, Any], out_dir: Path, started: datetime) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%S")
    text = json.dumps(_finite(doc), indent=2, default=_jsonable, allow_nan=False)
    path = out_dir / f"results-{stamp}.json"
    path.write_text(text + "\n", encoding="utf-8")
    (out_dir / "latest.json").write_text(text + "\n", encoding="utf-8")
    return path


def _finite(value: Any) -> Any:
    """NaN and infinities become null: the files stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: object) -> object:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)
