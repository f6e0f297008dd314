"""Byte scans of a store folder: which files still hold a session's text or ids (for erasure tests)."""

from __future__ import annotations

from pathlib import Path

from convmem.events import MemoryKey, encode_token

__all__ = ["markers", "scan"]


def markers(key: MemoryKey, text: str) -> list[bytes]:
    """Byte strings that betray `key` or `text` in a file: the ids in clear and as subject tokens."""
    found = [text.encode(), key.user_id.encode(), key.session_id.encode()]
    found += [encode_token(key.user_id).encode(), encode_token(key.session_id).encode()]
    return found


def scan(store: Path, needles: list[bytes]) -> dict[bytes, list[str]]:
    """Every needle found in any file under `store`, with the files that hold it."""
    hits: dict[bytes, list[str]] = {}
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for needle in needles:
            if needle in data:
                hits.setdefault(needle, []).append(str(path.relative_to(store)))
    return hits
