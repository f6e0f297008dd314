"""Reading the small files a deployment hands convmem (a config or policy document, a key file).

Such a path comes from outside (an option, a variable, a setting) and may name anything: a file of
gigabytes, ``/dev/zero`` or a pipe, which a plain read would follow until memory runs out, or wait
on forever. `read_limited` reads only a regular file, and only up to a bound.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from convmem.errors import InvalidInput

__all__ = ["read_limited"]


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`: `InvalidInput` naming it when it is not a regular file or
    holds more than `limit` bytes; `OSError` when it cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe's open would wait for a writer
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(str(path), "is not a regular file (a device, a pipe or a socket)")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InvalidInput(str(path), f"is larger than {limit:,} bytes, far more than such a file holds")
        return b"".join(chunks)
    finally:
        os.close(fd)
