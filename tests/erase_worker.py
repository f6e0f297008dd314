"""An eraser process for the erasure tests: erases a user, and kills itself (kill -9) after one step.

    python tests/erase_worker.py URL TENANT USER STEP

Connects to the NATS server at URL and erases every session of USER; right
after the erasure step named STEP (one of `ERASURE_STEPS`) it prints
``KILLED-AFTER <step>`` and sends itself SIGKILL, as a crash would stop it:
no cleanup, no close. A STEP that no step has lets the erasure finish.
"""

from __future__ import annotations

import os
import signal
import sys

import convmem


def main() -> int:
    url, tenant, user, stop_after = sys.argv[1:5]

    def hook(step: str) -> None:
        if step == stop_after:
            print(f"KILLED-AFTER {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    memory = convmem.connect(url, erasure_hook=hook, timeout=5.0)
    erased = memory.erase_user(tenant, user, by="erase-worker")
    print(f"ERASED {erased.sessions} {erased.events_purged}", flush=True)
    memory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
