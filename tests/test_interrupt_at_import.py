"""Ctrl-C while the `convmem` command is still importing: exit 130 and one line, no traceback.

A real SIGINT reaches a real process at a known point of its imports: a
`sitecustomize` on the child's path (tests only) holds the import of one
module, says so on stderr, and waits for its stdin to close. The test waits
for that line (a fact, not a time), sends SIGINT to the process group as a
terminal's Ctrl-C does, then lets the import go on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0

HOLD = '''
import os
import sys

HOLD = os.environ["CONVMEM_TEST_HOLD_IMPORT"]


class Hold:
    """Hold the import of HOLD until stdin closes, after saying so on stderr."""

    def find_spec(self, name, path=None, target=None):
        if name == HOLD:
            sys.meta_path.remove(self)
            sys.stderr.write(f"holding {name}\\n")
            sys.stderr.flush()
            sys.stdin.read()
        return None


sys.meta_path.insert(0, Hold())
'''


def console_script(tmp: Path) -> Path:
    """The `convmem` console script as pip writes it from pyproject's entry point (not the installed one)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, attr = scripts["convmem"].partition(":")
    path = tmp / "convmem"
    path.write_text(
        "import re\n"
        "import sys\n"
        f"from {module} import {attr}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({attr}())\n",
        encoding="utf-8",
    )
    return path


def interrupted_while_importing(tmp: Path, argv: list[str], module: str) -> tuple[int, str]:
    """Run `argv` holding the import of `module`, Ctrl-C it there; its exit code and stderr."""
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(HOLD, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "CONVMEM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "hook"), str(ROOT), env.get("PYTHONPATH", "")])
    env["CONVMEM_TEST_HOLD_IMPORT"] = module
    env["CONVMEM_DATA_DIR"] = str(tmp / "no-store")
    with subprocess.Popen(
        [sys.executable, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            first: list[str] = []
            reader = threading.Thread(target=lambda: first.append(proc.stderr.readline()))  # type: ignore[union-attr]
            reader.start()
            reader.join(WAIT)
            assert first == [f"holding {module}\n"], f"the import of {module} was never held: {first}"
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C, mid-import
            _, rest = proc.communicate(timeout=WAIT)  # closing stdin lets the held import go on
            return proc.returncode, rest
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("module", ["convmem.adapters", "nats", "convmem.adapters.frontends.cli._main"])
@pytest.mark.parametrize("how", ["console script", "python -m convmem"])
def test_ctrl_c_while_the_command_imports_exits_130_without_a_traceback(
    tmp_path: Path, how: str, module: str
) -> None:
    """At any of the command line's first imports, a Ctrl-C ends the command: exit 130, one line."""
    start = [str(console_script(tmp_path))] if how == "console script" else ["-m", "convmem"]
    code, stderr = interrupted_while_importing(tmp_path, [*start, "sessions"], module)
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr
    assert stderr == "convmem: interrupted\n"
    assert code == 130


def test_serve_interrupted_while_importing_has_started_nothing_and_exits_0(tmp_path: Path) -> None:
    """`serve` Ctrl-C'd mid-import says it stopped before starting anything, exit 0 as any stop of serve."""
    code, stderr = interrupted_while_importing(
        tmp_path, [str(console_script(tmp_path)), "serve"], "convmem.adapters"
    )
    assert "Traceback" not in stderr
    assert stderr == "convmem serve: SIGINT while starting; stopped (nothing had started)\n"
    assert code == 0
    assert not (tmp_path / "no-store").exists()
