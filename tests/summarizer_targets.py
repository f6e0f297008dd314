"""Summarizers a `ProcessSummarizer` child builds in the tests (importable there through PYTHONPATH)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any


class Scripted:
    """Answers with the first turn's user text; hangs on "hang", raises on "boom", prints on "print"."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        said = request["turns"][0]["user"]
        if said == "hang":
            threading.Event().wait()
        if said == "boom":
            raise RuntimeError("the summarizer failed on purpose")
        if said == "print":
            print("noise on stdout")  # must not break the replies
        return {"summary": f"{self.prefix}{said} (pid {os.getpid()})"}


def broken(**kwargs: Any) -> Scripted:
    raise ValueError("cannot build this one")
