"""A planner process for the cluster tests: a MemorySystem on the R3 stream, writing its own sessions.

    python tests/cluster_worker.py URLS WRITER SESSIONS TURNS

URLS is comma-separated (every node). Writes TURNS turns to each of the
sessions ``cluster:WRITER:s0`` .. (round robin, four threads), each with an
idempotency key, retrying a failed write with the same key until it is
acknowledged or a minute has passed. Prints ``ACK <session> <text>`` after
each acknowledgement and ``RETRY <session> <text> <error>`` after each
failure, flushed, so the parent sees what happened when. At the end, for each
session, ``STATE <session> <the live state, msgpack in base64>``, then ``DONE``.
"""

from __future__ import annotations

import base64
import sys

import msgspec
from retrying_writer import say, write_rounds

import convmem
from convmem.events import MemoryKey, ShortTermMemoryConfig

RETRY_FOR = 60.0


def main() -> int:
    urls, writer, sessions, turns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = ShortTermMemoryConfig(strategy="truncation")
    keys = [MemoryKey("cluster", writer, f"s{i}") for i in range(sessions)]

    with convmem.connect(urls, config=config, replicas=3, timeout=2.0) as memory:
        failed = write_rounds(
            memory,
            keys,
            range(turns),
            text_of=lambda _key, n: f"{writer}-{n}",
            timeout=5,
            retry_for=RETRY_FOR,
        )
        if failed:
            say(f"GAVE-UP {' '.join(failed)}")
            return 1
        for key in keys:
            state = memory.session(key).snapshot_state()
            say(f"STATE {key.session_id} {base64.b64encode(msgspec.msgpack.encode(state)).decode()}")
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
