"""`convmem serve` stopped by real signals, as a terminal and an operator send them.

Each case starts `convmem serve` on the embedded server as a process in a
session of its own (so its process group is the one a terminal would signal),
writes turns through it, signals it, and checks: exit 0, no traceback
anywhere in its output, every process it started gone, and the turns still
in the store. The README's "serve in one terminal, plan in another" runs here
as written, on a free port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import convmem
from convmem.adapters.backends.jetstream._embedded import running_server_url
from convmem.events import ConversationTurn, MemoryKey

WAIT = 60.0
README = Path(__file__).resolve().parent.parent / "README.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def in_session(sid: int) -> list[int]:
    """The live processes of session `sid` (what `convmem serve` started stays in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
            except ProcessLookupError:
                continue
    return found


class Serve:
    """`convmem serve` as the leader of a new session: its pid is its process group's id."""

    def __init__(self, tmp: Path, argv: list[str], env: dict[str, str]) -> None:
        self.out = tmp / "serve.out"
        self.ready = tmp / "ready"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [*argv, "--ready-file", str(self.ready)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        while not self.ready.exists():
            try:  # waiting on the process doubles as the pause between checks
                code = self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"convmem serve exited with {code}: {self.output()}")

    def output(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def stopped_by(self, signum: signal.Signals, *, group: bool) -> int:
        """Send `signum` to the process group (a terminal's Ctrl-C) or to serve alone; its exit code."""
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)
        return self.proc.wait(WAIT)

    def kill(self) -> None:
        for pid in in_session(self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(WAIT)


def serve_env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "CONVMEM_"))}
    env["CONVMEM_DATA_DIR"] = str(data)
    return env


def assert_clean(serve: Serve, code: int) -> None:
    output = serve.output()
    assert code == 0, output
    assert "Traceback" not in output
    assert "did not stop" not in output
    assert "stopped; every acknowledged turn is in the log" in output
    # multiprocessing's resource tracker ends once serve is gone (its pipe closes): wait for that fact
    deadline = time.monotonic() + WAIT
    while left := in_session(serve.proc.pid):
        assert time.monotonic() < deadline, f"processes serve started outlived it: {left}"
        threading.Event().wait(0.05)


def test_sigterm_to_the_process_group_ends_serve_cleanly_and_keeps_every_turn(tmp_path: Path) -> None:
    """Exit 0, no traceback, no process left, and the acknowledged turns are in the store afterwards.

    SIGTERM or SIGINT to serve alone: `tests/test_serve.py`; SIGINT to the group (Ctrl-C): the README's case.
    """
    data, port = tmp_path / "data", free_port()
    argv = [sys.executable, "-m", "convmem", "serve", "--port", str(port), "--workers", "2"]
    serve = Serve(tmp_path, argv, serve_env(data))
    keys = [MemoryKey("acme", "alice", f"s{n}") for n in range(3)]
    try:
        assert serve.ready.read_text(encoding="utf-8") == f"nats://127.0.0.1:{port}"
        with convmem.connect_remote(f"nats://127.0.0.1:{port}", timeout=WAIT) as remote:
            for key in keys:
                for n in range(2):
                    remote.session(key).add_turn(
                        ConversationTurn(user_message=f"m{n}", assistant_response="ok")
                    )
        assert_clean(serve, serve.stopped_by(signal.SIGTERM, group=True))
    finally:
        if serve.proc.poll() is None:
            serve.kill()
    assert running_server_url(data) is None  # the embedded server is stopped: its lock is free
    with convmem.connect(data_dir=data) as memory:
        for key in keys:
            assert [
                t["user"]
                for t in memory.session(key).get_llm_context()["conversation_memory"]["recent_turns"]
            ] == [
                "m0",
                "m1",
            ]


def readme_terminals() -> tuple[list[str], str, list[str]]:
    """The README's two-terminal example: serve's argv, the planner's script, the audit's argv."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Serve in one terminal, plan in another") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    lines = block.group(1).splitlines()
    commands = [line for line in lines if line.startswith("convmem ")]
    script = block.group(1).split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    assert len(commands) == 2
    return commands[0].split(), script, commands[1].split()


def python(
    args: list[str], env: dict[str, str], *, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run this Python with `args` to its end (within WAIT seconds); its exit code and output as text."""
    return subprocess.run(
        [sys.executable, *args],
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT,
        check=False,
    )


def test_the_readme_serve_here_plan_there_runs_as_written(tmp_path: Path) -> None:
    """Serve on a fixed port, a planner writes through it, Ctrl-C (SIGINT to the group), then audit."""
    serve_argv, script, audit_argv = readme_terminals()
    port = free_port()
    assert serve_argv[:3] == ["convmem", "serve", "--port"]
    env = serve_env(tmp_path / "data")
    serve_argv = [sys.executable, "-m", "convmem", *serve_argv[1:3], str(port), *serve_argv[4:]]
    serve = Serve(tmp_path, [*serve_argv, "--workers", "1"], env)
    try:
        planner = python(["-"], env, input=script.replace("4333", str(port)))
        assert planner.returncode == 0, planner.stderr
        assert "Hi, I'm Alice." in planner.stdout
        assert_clean(serve, serve.stopped_by(signal.SIGINT, group=True))
    finally:
        if serve.proc.poll() is None:
            serve.kill()
    audit = python(["-m", "convmem", *audit_argv[1:]], env)
    assert audit.returncode == 0, audit.stderr
    assert "acme:alice:chat-1" in audit.stdout


def test_a_program_interrupted_before_it_closed_its_embedded_server_leaves_none_running(
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT to the group) on a planner holding an embedded server: the server ends with it.

    The server no longer gets the terminal's SIGINT itself (its own process group); the
    program's exit stops what it left running.
    """
    script = (
        "import signal, sys\n"
        # A program in a terminal takes Ctrl-C; a runner started in the background (nohup, `&`
        # without job control) hands its children SIGINT ignored, which Python then keeps.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from convmem.adapters import EmbeddedNatsServer\n"
        f"server = EmbeddedNatsServer({str(tmp_path / 'store')!r}).start()\n"
        "print(server.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    planner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    server = 0
    try:
        assert planner.stdout is not None
        server = int(planner.stdout.readline())
        assert alive(server)
        assert os.getpgid(server) == server  # a process group of its own
        os.killpg(planner.pid, signal.SIGINT)
        planner.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while alive(server):
            assert time.monotonic() < deadline, "the embedded server outlived the program that started it"
            threading.Event().wait(0.05)
    finally:
        if planner.poll() is None:
            planner.kill()
        planner.communicate(timeout=WAIT)
        if server and alive(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.slow  # `serve` with its worker processes, 10 s and more (`.ci/run` runs it)
def test_ctrl_c_while_the_workers_start_stops_serve_cleanly(tmp_path: Path) -> None:
    """SIGINT to the group the moment a worker process exists (it is still importing): exit 0, no traceback.

    A worker is born ignoring the stop signals until it has left serve's process
    group and taken them; serve repeats its SIGTERM until each worker ends.
    """
    out = tmp_path / "serve.out"
    with open(out, "wb") as sink:
        serve = subprocess.Popen(
            [sys.executable, "-m", "convmem", "serve", "--workers", "2"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=serve_env(tmp_path / "data"),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + WAIT
        while not any(
            "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            for pid in in_session(serve.pid)
            if Path(f"/proc/{pid}/cmdline").exists()
        ):
            assert time.monotonic() < deadline, "no worker started"
            assert serve.poll() is None, out.read_text(errors="replace")
            threading.Event().wait(0.01)
        os.killpg(serve.pid, signal.SIGINT)
        code = serve.wait(WAIT)
        output = out.read_text(errors="replace")
        assert code == 0, output
        assert "Traceback" not in output
        assert "did not stop" not in output
        deadline = time.monotonic() + WAIT
        while left := in_session(serve.pid):
            assert time.monotonic() < deadline, f"processes serve started outlived it: {left}"
            threading.Event().wait(0.05)
    finally:
        if serve.poll() is None:
            for pid in in_session(serve.pid):
                os.kill(pid, signal.SIGKILL)
            serve.wait(WAIT)
