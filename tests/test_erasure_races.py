"""Erasures racing the commands that write a session's old data again: a lost-session restore, a fork.

`convmem restore` writes a kept snapshot back as events, and `fork` copies a
session's events into a new session. Both write *old* data, so an erasure
that covers what they read must cover what they wrote too, whether it was
recorded before they began (a pending one), while they ran, or finished
meanwhile. The checks are the erased text's bytes in the store's files, on a
real nats-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import PlannedSummarizer, summarizing_config, wait_until
from store_scan import markers, scan
from test_serve import Serve, wait_for, workers

import convmem
from convmem.actors import ErasureRequest, MemorySystem, Snapshot, find_erasure
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    JetStreamBackend,
)
from convmem.adapters.backends import FileExportRegistry
from convmem.adapters.backends.jetstream import _write
from convmem.adapters.frontends.cli import main
from convmem.adapters.frontends.service import RemoteMemory
from convmem.errors import ConvmemError, InvalidInput, StoreNotFound
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    ShortTermMemoryConfig,
)

WORKER = Path(__file__).with_name("erase_worker.py")
CONFIG = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))
TENANT, USER = "acme", "gail.QW7RT@example.com"
SECRET = "gail's card 5500-QW7RT"
KEY = MemoryKey(TENANT, USER, "chat-QW7RT-1")
FORK = MemoryKey(TENANT, USER, "chat-QW7RT-fork")
KEPT = MemoryKey(TENANT, "hank.QW7RT-kept", "chat-kept")
KEPT_TEXT = "hank's note QW7RT-KEPT"


def write(memory: MemorySystem, key: MemoryKey, text: str, turns: int = 3) -> None:
    session = memory.session(key)
    for n in range(turns):
        session.add_turn(ConversationTurn(user_message=f"{text} #{n}", assistant_response="noted"))


def seed(url: str) -> None:
    """The user's session (with a snapshot) and another user's kept one."""
    with convmem.connect(url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY, SECRET)
        write(memory, KEPT, KEPT_TEXT)


def lose_events(url: str) -> None:
    """The log loses the user's session, its snapshot stays (a crash; no erasure recorded)."""
    with JetStreamBackend.connect(url) as backend:
        backend.log.erase(KEY, at=1.0)
        assert backend.snapshots.load(KEY) is not None


def secrets() -> list[bytes]:
    return sorted({SECRET.encode(), *markers(KEY, SECRET), *markers(FORK, SECRET)})


def check_erased_on_disk(server: EmbeddedNatsServer, store: Path) -> None:
    server.stop()
    assert scan(store, secrets()) == {}
    assert set(scan(store, markers(KEPT, KEPT_TEXT))) == set(markers(KEPT, KEPT_TEXT)), "the scan sees"


def kill_after(url: str, step: str) -> None:
    """An eraser process of the user that kills itself (SIGKILL) right after `step`."""
    done = subprocess.run(
        [sys.executable, str(WORKER), url, TENANT, USER, step],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    assert done.stdout.strip() == f"KILLED-AFTER {step}"


def test_a_restore_run_while_an_erasure_runs_writes_nothing_that_stays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The erasure has erased the events and not yet the snapshot, so the session looks lost: a
    `convmem restore` run then is refused and writes nothing back, and the erasure leaves no byte."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        codes: list[int] = []

        def restore_now(step: str) -> None:
            if step == "events":  # the user's events are gone, the snapshot not yet
                codes.append(main(["-s", server.url, "restore", KEY.composite(), "--yes", "--json"]))

        with convmem.connect(server.url, config=CONFIG, erasure_hook=restore_now) as memory:
            memory.erase_user(TENANT, USER, by="ops")
        assert codes == [5], capsys.readouterr()
        assert "was erased (the erasure journal records it)" in capsys.readouterr().err  # before writing
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.log.keys(tenant_id=TENANT, user_id=USER) == []
            assert backend.snapshots.keys(tenant_id=TENANT, user_id=USER) == []
        check_erased_on_disk(server, store)


def test_a_restore_of_a_session_whose_erasure_is_pending_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The eraser was killed after the events: `convmem restore` (which finishes no erasure) refuses,
    and `memory.restore_lost` too; the resume then leaves no byte."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        kill_after(server.url, "events")
        assert main(["-s", server.url, "restore", KEY.composite(), "--yes"]) == 5
        assert "its snapshot is deleted, not restored" in capsys.readouterr().err  # before writing
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.log.keys(tenant_id=TENANT, user_id=USER) == []
        assert main(["-s", server.url, "erase", "--resume", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["resumed"] == 1
        check_erased_on_disk(server, store)


def test_an_erasure_run_in_a_restores_middle_leaves_nothing_it_wrote(tmp_path: Path) -> None:
    """The restore has loaded the snapshot and asked the journal (nothing then); the whole erasure of the
    user runs before it writes (it finds the snapshot, deletes it, and finishes). What the restore then
    writes is erased too: no byte is left."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        lose_events(server.url)
        with (
            convmem.connect(server.url, config=CONFIG) as restorer,
            convmem.connect(server.url, config=CONFIG) as eraser,
        ):
            read = restorer.log.read

            def erase_then_read(key: MemoryKey) -> object:
                if key == KEY:  # the restore has its snapshot and is about to read the log
                    eraser.erase_user(TENANT, USER, by="ops")
                return read(key)

            restorer.log.read = erase_then_read  # type: ignore[method-assign]
            with pytest.raises(InvalidInput, match="erased while it was restored"):
                restorer.restore_lost(KEY)
            restorer.log.read = read  # type: ignore[method-assign]
            assert restorer.log.read(KEY) == []
        check_erased_on_disk(server, store)


def test_a_lost_session_begun_after_an_old_erasure_is_still_restored(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """An erasure of the user that finished before the session was written does not block its restore."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, MemoryKey(TENANT, USER, "older"), "older text")
        memory.erase_user(TENANT, USER, by="ops")
    seed(nats_server.url)
    lose_events(nats_server.url)
    assert main(["-s", nats_server.url, "restore", KEY.composite(), "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["turns"] >= 1
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        assert SECRET in str(memory.session(KEY).get_llm_context())
        assert find_erasure(memory.journal, KEY) is not None  # the old receipt covers the user


def test_a_fork_made_while_an_erasure_of_the_user_is_pending_is_refused(
    nats_server: EmbeddedNatsServer,
) -> None:
    """A system started before the eraser was killed (before it listed the sessions) forks the user's
    session: the copy would be of data under erasure, so the fork is refused and writes nothing."""
    seed(nats_server.url)
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        kill_after(nats_server.url, "drop_live")
        assert len(memory.pending_erasures()) == 1
        with pytest.raises(InvalidInput, match="pending"):
            memory.fork(KEY, to=FORK)
        assert memory.log.read(FORK) == []
        assert memory.finish_erasures()
    with JetStreamBackend.connect(nats_server.url) as backend:
        assert backend.log.keys(tenant_id=TENANT, user_id=USER) == []


@pytest.mark.parametrize("into", ["same user", "other user"])
def test_a_fork_made_while_the_user_is_erased_does_not_keep_the_erased_turns(
    tmp_path: Path, into: str
) -> None:
    """A running system forks the user's session while another one erases the user; the erasure lists
    the sessions before the fork is written and erases the source after it was read (the hook runs the
    erasure's listing and deletion in the fork's middle). The fork is erased too: no byte is left."""
    to = FORK if into == "same user" else MemoryKey(TENANT, "hank.QW7RT-kept", "chat-QW7RT-fork")
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        with (
            convmem.connect(server.url, config=CONFIG) as forker,
            convmem.connect(server.url, config=CONFIG) as eraser,
        ):
            read = forker.log.read

            def read_then_erase(key: MemoryKey) -> object:
                records = read(key)
                if key == KEY:  # the fork has read the source: the whole erasure runs now
                    eraser.erase_user(TENANT, USER, by="ops")
                return records

            forker.log.read = read_then_erase  # type: ignore[method-assign]
            with pytest.raises(InvalidInput, match="erased while it was forked"):
                forker.fork(KEY, to=to)
            forker.log.read = read  # type: ignore[method-assign]
            assert forker.log.read(to) == []
            assert forker.erasure_record(to) is not None
        check_erased_on_disk(server, store)


def test_a_stale_snapshot_is_erased_data_by_any_receipt_not_only_the_first() -> None:
    """The user was erased twice: an old receipt (before the snapshot) and a new one (after it). The
    snapshot left behind is erased data by the new one, whichever receipt the journal lists first."""
    log, snapshots, journal = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal, snapshot_every=1) as memory:
        write(memory, KEY, SECRET)
    log.erase(KEY, at=1.0)  # the events gone, the snapshot left (as a stale process's save would leave it)
    for completed in (1.0, 4e9):  # the old receipt first
        request = ErasureRequest.of(TENANT, USER, None, by="ops", at=completed)
        journal.record(request)
        journal.complete(request.receipt(completed_at=completed, sessions=1, events_purged=4))
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        assert memory.session(KEY).get_llm_context()["conversation_memory"]["recent_turns"] == []
        with pytest.raises(StoreNotFound):
            memory.restore_lost(KEY)
    assert snapshots.load(KEY) is None


def test_a_summary_of_erased_turns_finished_after_the_erasure_is_not_stored(tmp_path: Path) -> None:
    """A system summarizes the user's turns (its summarizer hangs) while another one erases the user;
    the summary, made of the erased turns, comes back after the erasure returned: it is neither
    appended nor snapshotted, and no byte of it is left once the summarizing system closes."""
    store = tmp_path / "nats"
    summarizer = PlannedSummarizer(default="hang")
    with EmbeddedNatsServer(store) as server:
        with convmem.connect(server.url, config=CONFIG) as kept:
            write(kept, KEPT, KEPT_TEXT)
        summarizing = convmem.connect(
            server.url, config=summarizing_config(full_zone_turns=1), summarizer=summarizer, snapshot_every=1
        )
        try:
            write(summarizing, KEY, SECRET)
            summarizer.wait_calls(1)
            with convmem.connect(server.url, config=CONFIG) as eraser:
                eraser.erase_user(TENANT, USER, by="ops")
            summarizer.release()
        finally:
            summarizing.close()
        assert summarizer.hanging == 0
        check_erased_on_disk(server, store)


# -- writes going on through `convmem serve --workers 2` and an in-process system ------------------


class Writer(threading.Thread):
    """Writes turns to its own session of the user without pause, each marked with its phase: ``PRE``
    for a write acknowledged before the erasure began, ``POST`` for one begun after it returned."""

    def __init__(self, name: str, add_turn: Callable[[str], object], phases: Phases) -> None:
        super().__init__(name=name, daemon=True)
        self.add_turn, self.phases = add_turn, phases
        self.pre: list[str] = []
        self.post: list[str] = []
        self.refused = 0

    def run(self) -> None:
        n = 0
        while len(self.post) < 5:
            phase = self.phases.phase()
            n += 1
            text = f"<{phase}-{self.name}-{n}-QW7RT>"
            try:
                self.add_turn(text)
            except ConvmemError:
                self.refused += 1  # a stale copy met the erasure's fence: refused, nothing stored
                continue
            if phase == "POST":
                self.post.append(text)
            elif self.phases.phase() == "PRE":  # acknowledged before the erasure began
                self.pre.append(text)
            self.phases.wrote()


class Phases:
    """Where the erasure is (before, during, after), and how many writes each writer made."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._phase = "PRE"
        self._writes = 0

    def phase(self) -> str:
        with self._cond:
            return self._phase

    def set(self, phase: str) -> None:
        with self._cond:
            self._phase = phase

    def wrote(self) -> None:
        with self._cond:
            self._writes += 1
            self._cond.notify_all()

    def wait_writes(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._writes >= n, 60.0), "the writers stalled"


@pytest.mark.slow  # `serve` with its worker processes (`.ci/run` runs it)
def test_an_erasure_while_writes_go_on_through_serve_and_a_system_leaves_none_of_the_earlier_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three writers (two through `convmem serve --workers 2`, one through an in-process system) write
    the user's sessions while `convmem erase` erases the user: no turn acknowledged before the erasure
    began is left in any store file, every turn written after it returned is, and so is another user's."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        url = server.url
        seed(url)
        ready, err_path = tmp_path / "ready", tmp_path / "serve.err"
        with open(err_path, "wb") as err:
            serve = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "convmem",
                    "--nats",
                    url,
                    "serve",
                    "--workers",
                    "2",
                    "--ready-file",
                    str(ready),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        phases = Phases()
        try:
            wait_until(ready.exists, timeout=60.0, message="serve is ready")
            with RemoteMemory(url) as remote, convmem.connect(url, config=CONFIG) as local:

                def remote_writer(name: str) -> Writer:
                    session = remote.session(MemoryKey(TENANT, USER, f"chat-{name}"))
                    return Writer(
                        name,
                        lambda t: session.add_turn(ConversationTurn(user_message=t, assistant_response="ok")),
                        phases,
                    )

                local_session = local.session(MemoryKey(TENANT, USER, "chat-local"))
                writers = [
                    remote_writer("w0"),
                    remote_writer("w1"),
                    Writer(
                        "local",
                        lambda t: local_session.add_turn(
                            ConversationTurn(user_message=t, assistant_response="ok")
                        ),
                        phases,
                    ),
                ]
                for writer in writers:
                    writer.start()
                phases.wait_writes(30)
                phases.set("DURING")
                assert main(["-s", url, "erase", "--tenant", TENANT, "--user", USER, "--yes", "--json"]) == 0
                capsys.readouterr()
                phases.set("POST")
                for writer in writers:
                    writer.join(120.0)
                    assert not writer.is_alive()
        finally:
            serve.send_signal(signal.SIGTERM)
            code = serve.wait(60.0)
        assert code == 0, err_path.read_text(encoding="utf-8")
        server.stop()
        pre = [w for writer in writers for w in writer.pre]
        post = [w for writer in writers for w in writer.post]
        assert len(pre) >= 3
        assert len(post) == 15
        assert scan(store, [SECRET.encode(), *(t.encode() for t in pre)]) == {}
        assert set(scan(store, [t.encode() for t in post])) == {t.encode() for t in post}
        assert set(scan(store, [KEPT_TEXT.encode()])) == {KEPT_TEXT.encode()}


def test_a_fence_published_unconditionally_erases_and_stale_writers_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The path an erasure takes when writers keep winning its conditional fence (`_FENCE_ATTEMPTS` of
    them, here none): the fence lands far above the last seq, unconditionally; the erasure finishes, a
    system that held the session live writes a new session above it, verify passes, no byte is left."""
    monkeypatch.setattr(_write, "_FENCE_ATTEMPTS", 0)
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        with convmem.connect(server.url, config=CONFIG) as stale:
            assert SECRET in str(stale.session(KEY).get_llm_context())  # live here
            with convmem.connect(server.url, config=CONFIG) as eraser:
                assert eraser.erase_user(TENANT, USER, by="ops").sessions == 1
            write(stale, KEY, "after the erasure QW7RT-AFTER", turns=2)
            context = str(stale.session(KEY).get_llm_context())
            assert "QW7RT-AFTER" in context
            assert SECRET not in context
        assert main(["-s", server.url, "verify", "--all"]) == 0, capsys.readouterr()
        server.stop()
        assert scan(store, [SECRET.encode()]) == {}  # the ids stay: the user's new session holds them
        assert set(scan(store, [b"QW7RT-AFTER", KEPT_TEXT.encode()])) == {b"QW7RT-AFTER", KEPT_TEXT.encode()}


@pytest.mark.slow  # `serve` with its worker processes (`.ci/run` runs it)
def test_a_serve_worker_killed_while_an_erasure_is_pending_finishes_it_when_restarted(tmp_path: Path) -> None:
    """An eraser dies (kill -9) after erasing the events, with the user's sessions live in a running
    `serve --workers 2`; then a worker is killed with kill -9 too. The worker its serve starts again
    finishes the pending erasure: no byte is left, and the other user's turns are served still."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        serve = Serve(server.url, tmp_path, "--workers", "2")
        try:
            with RemoteMemory(server.url, timeout=30.0) as remote:
                assert SECRET in str(remote.session(KEY).get_llm_context())  # live in a worker
                seen = wait_for(
                    lambda: workers(server.url) if len(workers(server.url)) == 2 else None,
                    "2 workers",
                    serve.proc,
                )
                kill_after(server.url, "events")
                with JetStreamBackend.connect(server.url, read_only=True) as reader:
                    assert reader.journal is not None
                    assert len(reader.journal.pending()) == 1
                    os.kill(seen[0]["pid"], signal.SIGKILL)
                    wait_for(
                        lambda: (workers(server.url).get(0) or {}).get("pid") not in (None, seen[0]["pid"]),
                        "worker 0 started again",
                        serve.proc,
                    )
                    assert reader.journal.pending() == []
                assert SECRET not in str(remote.session(KEY).get_llm_context())
                assert KEPT_TEXT in str(remote.session(KEPT).get_llm_context())
            serve.proc.send_signal(signal.SIGTERM)
            assert serve.proc.wait(60.0) == 0, serve.stderr()
        finally:
            serve.stop()
        check_erased_on_disk(server, store)


def test_a_compaction_whose_session_is_erased_before_its_snapshot_is_saved_leaves_no_snapshot(
    tmp_path: Path,
) -> None:
    """A retention sweep has appended its compaction of the user's long session and is about to save
    the compacted state's snapshot (the newest turns) when an erasure of the user runs to its end. The
    snapshot the sweep then saves holds erased turns: it does not stay in the bucket."""
    store = tmp_path / "nats"
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=2))
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        with (
            convmem.connect(server.url, config=CONFIG) as sweeper,
            convmem.connect(server.url, config=CONFIG) as eraser,
        ):
            write(sweeper, KEY, SECRET + " more", turns=4)
            write(sweeper, KEPT, KEPT_TEXT + " more", turns=4)
            assert sweeper.snapshots is not None
            save = sweeper.snapshots.save

            def erase_then_save(snapshot: Snapshot) -> None:
                if snapshot.key == KEY:  # the compaction is stored; its snapshot not yet
                    eraser.erase_user(TENANT, USER, by="ops")
                save(snapshot)

            sweeper.snapshots.save = erase_then_save  # type: ignore[method-assign]
            sweeper.sweep_retention(policies=policies)
            sweeper.snapshots.save = save  # type: ignore[method-assign]
            assert sweeper.snapshots.keys(tenant_id=TENANT, user_id=USER) == []
            kept = sweeper.snapshots.load(KEPT)  # a compaction not erased keeps its snapshot
            assert kept is not None
            assert kept.event_id.startswith("retention/")
        check_erased_on_disk(server, store)


def test_an_export_written_while_the_user_is_erased_loses_their_lines(
    nats_server: EmbeddedNatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`convmem export -o FILE` has read the user's events and written the file; the whole erasure of
    the user runs before the export records the file. The file must not keep the erased turns."""
    monkeypatch.setenv("CONVMEM_EXPORTS", str(tmp_path / "exports.json"))
    seed(nats_server.url)
    out = tmp_path / "acme.jsonl"
    record = FileExportRegistry.record

    def erase_then_record(self: FileExportRegistry, path: Path, keys: Iterable[MemoryKey]) -> None:
        with convmem.connect(nats_server.url, config=CONFIG) as eraser:
            eraser.erase_user(TENANT, USER, by="ops")
        record(self, path, keys)

    monkeypatch.setattr(FileExportRegistry, "record", erase_then_record)
    main(["-s", nats_server.url, "export", "--tenant", TENANT, "-o", str(out)])
    capsys.readouterr()
    assert KEPT_TEXT.encode() in out.read_bytes()
    assert SECRET.encode() not in out.read_bytes()


def test_an_erasure_finishes_while_a_writer_appends_after_each_of_its_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planner keeps writing the session: after every read the eraser makes of it, one more turn is
    stored. The erasure's reads must not wait for a subject that stops growing (they were made again
    until none had grown, then failed as a 'lagging replica'), nor its fence for writers to pause."""
    store = tmp_path / "nats"
    fetch = _write.fetch_subject_counted
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        with (
            convmem.connect(server.url, config=CONFIG) as writer,
            convmem.connect(server.url, config=CONFIG) as eraser,
        ):
            busy = threading.Lock()
            written = 0

            async def fetch_then_write(conn: Any, stream: str, subject: str, **options: Any) -> Any:
                nonlocal written
                result = await fetch(conn, stream, subject, **options)
                if subject.endswith(".chat-QW7RT-1") and written < 40 and busy.acquire(blocking=False):
                    try:  # another system, on a loop of its own: one more turn, acknowledged
                        written += 1
                        write(writer, KEY, f"<later-{written}>", turns=1)
                    finally:
                        busy.release()
                return result

            monkeypatch.setattr(_write, "fetch_subject_counted", fetch_then_write)
            assert eraser.erase_user(TENANT, USER, by="ops").sessions == 1
            monkeypatch.setattr(_write, "fetch_subject_counted", fetch)
            assert written >= 1
        server.stop()
        assert scan(store, [SECRET.encode()]) == {}
        assert set(scan(store, [KEPT_TEXT.encode()])) == {KEPT_TEXT.encode()}


def test_a_snapshot_a_closing_system_saves_after_an_erasure_of_it_does_not_stay(tmp_path: Path) -> None:
    """A system writes the user's session and closes at once; the snapshot that write made due is
    saved while it closes (no erasure notice is heard any more), after an erasure of the user by
    another system ran to its end. It holds erased turns: it goes."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url)
        with convmem.connect(server.url, config=CONFIG) as eraser:
            live = convmem.connect(server.url, config=CONFIG, snapshot_every=1)
            assert live.snapshots is not None
            save = live.snapshots.save
            erased: list[int] = []

            def erase_then_save(snapshot: Snapshot) -> None:
                if snapshot.key == KEY and not erased:  # the write is stored, its snapshot not yet
                    erased.append(eraser.erase_user(TENANT, USER, by="ops").sessions)
                save(snapshot)

            live.snapshots.save = erase_then_save  # type: ignore[method-assign]
            try:
                write(live, KEY, SECRET + " again", turns=1)
            finally:
                live.close()  # the actor's last messages (the snapshot's save) are handled first
        assert erased == [1]
        check_erased_on_disk(server, store)


_RECORDER = """
import sys
from pathlib import Path
from convmem.adapters.backends import FileExportRegistry
from convmem.events import MemoryKey
registry, tag, count = FileExportRegistry(Path(sys.argv[1])), sys.argv[2], int(sys.argv[3])
for n in range(count):
    registry.record(Path(sys.argv[1]).parent / f"{tag}-{n}.jsonl", [MemoryKey("acme", f"u{tag}", f"s{n}")])
"""


def test_export_registry_writers_in_several_processes_keep_every_entry(tmp_path: Path) -> None:
    """Exports and erasures in different processes each read, change and write the registry: without
    a lock between processes the last writer dropped the others' entries, and a file whose entry was
    dropped is never rewritten by a later erasure."""
    registry = tmp_path / "exports.json"
    processes, each = 6, 40
    writers = [
        subprocess.Popen([sys.executable, "-c", _RECORDER, str(registry), str(p), str(each)])
        for p in range(processes)
    ]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    files = FileExportRegistry(registry).files()
    assert len(files) == processes * each, f"{processes * each - len(files)} entries lost"


def test_an_erasure_with_no_export_registry_creates_nothing(tmp_path: Path) -> None:
    """Erasing reads the registry and never creates it: no file, no lock file, no folder."""
    folder = tmp_path / "state" / "convmem"
    registry = FileExportRegistry(folder / "exports.json")
    request = ErasureRequest.of("acme", "alice", None, by="ops", at=0.0)
    assert registry.erase_copies(request) == 0
    assert registry.files() == []
    assert not folder.exists()
