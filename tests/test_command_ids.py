"""Command ids (the log's deduplication ids for writes without an idempotency key)."""

from __future__ import annotations

import os
import re
import warnings

from convmem.actors._ids import new_command_id


def test_ids_are_32_hex_digits_and_never_repeat_in_a_process() -> None:
    ids = [new_command_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    """After a fork both processes go on from the same counter: the child must draw new random bits."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns of forking a process with threads; the child here only writes and exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        try:
            os.write(write, new_command_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    parent = new_command_id()
    assert re.fullmatch(r"[0-9a-f]{32}", child)
    assert child[:16] != parent[:16]
