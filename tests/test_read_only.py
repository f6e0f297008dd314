"""Reads never write: every read-only command leaves a missing store missing and audits one it cannot write.

A mistyped `--data-dir` is exit 3 naming the path, and nothing is created
there. A store on read-only media is audited as it is: here a read-only bind
mount in a mount namespace of its own (`unshare -m`), which even root cannot
write (chmod would not stop root), and the store behind it is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import convmem
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryKey

KEY = "acme:alice:chat-1"
READS = [
    ["sessions"],
    ["inspect", KEY],
    ["replay", KEY],
    ["verify", "--all"],
    ["export"],
    ["timeline", KEY, "-o", "page.html"],
]


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_a_read_of_a_missing_store_names_it_and_creates_nothing(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 3, one line naming the path; the folder stays missing, and an empty folder stays empty."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("CONVMEM_NATS_URL", raising=False)
    missing = tmp_path / "no-such-folder"
    assert main(["--data-dir", str(missing), *argv]) == 3
    err = capsys.readouterr().err
    assert f"no convmem store at {missing}" in err
    assert len(err.strip().splitlines()) == 1
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--data-dir", str(empty), *argv]) == 3
    assert f"no convmem store at {empty}" in capsys.readouterr().err
    assert list(empty.iterdir()) == []
    assert not (tmp_path / "page.html").exists()


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` by its path, with its content's hash."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_store_on_read_only_media_is_audited_and_left_unchanged(tmp_path: Path) -> None:
    """`sessions` and `verify` on a read-only bind mount: exit 0, the session shown, no byte changed."""
    store = tmp_path / "store"
    with convmem.connect(data_dir=store) as memory:
        for n in range(3):
            memory.session(MemoryKey("acme", "alice", "chat-1")).add_turn(
                ConversationTurn(user_message=f"m{n}", assistant_response="ok")
            )
    (store / "convmem-nats.lock").unlink()  # media written elsewhere need not carry our lock file
    before = fingerprint(store)
    mount = tmp_path / "ro"
    mount.mkdir()
    convmem_cli = f"{sys.executable} -m convmem --data-dir {mount}"
    script = (
        f"mount --bind {store} {mount} && mount -o remount,ro,bind {mount} && "
        f"! touch {mount}/probe 2>/dev/null && "
        f"{convmem_cli} sessions && {convmem_cli} verify --all"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "CONVMEM_"))}
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare is needed to mount the store read-only"
    done = subprocess.run(
        [unshare, "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert KEY in done.stdout
    assert "1/1 sessions verified" in done.stdout
    assert "Traceback" not in done.stderr
    assert fingerprint(store) == before
    assert not (store / "convmem-nats.lock").exists()
