"""SIGTERM to a `convmem` command (a service manager's stop, `timeout`): the command ends as an
interrupted one, through its clean-up, so nothing it started outlives it.

Python's default for SIGTERM ends the process at once: `convmem demo` stopped so left its data
folder (`convmem-demo-*`) in the temporary folder for good. The console entry takes SIGTERM as
Ctrl-C (exit 130). `serve` has its own handler (a clean stop, `tests/test_serve_stops.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

WAIT = 120.0


def test_sigterm_to_the_demo_removes_its_data_folder_and_stops_its_server(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    with subprocess.Popen(
        [sys.executable, "-m", "convmem", "demo", "--sessions", "40", "--planners", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    ) as demo:
        try:
            assert demo.stderr is not None
            seen = []
            for line in demo.stderr:  # the demo says where its data is once it has made the folder
                seen.append(line)
                if "data in " in line:
                    break
            else:
                raise AssertionError(f"the demo ended before it started: {''.join(seen)}")
            assert any(p.name.startswith("convmem-demo-") for p in temporary.iterdir())
            demo.send_signal(signal.SIGTERM)
            rest = demo.stderr.read()
            code = demo.wait(WAIT)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
    assert code == 130, rest[-2000:]
    assert "interrupted" in rest
    left = sorted(p.name for p in temporary.iterdir())
    assert not [n for n in left if n.startswith(("convmem-demo-", "convmem-nats-"))], left
