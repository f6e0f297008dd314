"""Hostile files and arguments are one line naming what is wrong and where, with the documented exit code.

Retention policy files, serve configuration files, key files, JSONL exports read with ``--from-file``
and options given ``--`` as their value: a huge number, arrays nested past the parser's depth, bytes
that are not UTF-8, a seq that is not a whole number. Never an internal error (exit 70), never a bare
Python exception from the library. And an export of a damaged session names what it could not write
(exit 7), as verify does.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
from test_damage import CONFIG, FIRST, HURT, LATER, TURNS, flip, marker, seed, turn

import convmem
from convmem.actors import ErasureRequest, MemorySystem, export_jsonl, read_jsonl
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog
from convmem.adapters.backends._checksum import seal
from convmem.adapters.backends._exports import FileExportRegistry
from convmem.adapters.backends.jetstream._log import JetStreamEventLog
from convmem.adapters.backends.keys import master_key_from_file
from convmem.adapters.backends.summarizers import recommended
from convmem.adapters.frontends.cli._common import MAX_DOCUMENT_BYTES, CliError
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._serve import load_config
from convmem.errors import EncryptionKeyError, InvalidConfig, InvalidInput, LogUnavailable
from convmem.events import (
    ConversationTurn,
    HealthPolicy,
    MemoryBudget,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    SessionStarted,
    TurnAdded,
    encode_event,
)

HUGE = 10**400
KEY = MemoryKey("acme", "bob", "chat-1")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "internal error" not in lines[0]
    assert "Traceback" not in err
    return lines[0]


# -- retention policies and other configuration ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("idle.json", json.dumps({"default": {"idle": HUGE}}), "retention.default.idle"),
        ("age.toml", f"[tenants.acme]\nmax_age = {HUGE}\n", "retention.tenants.acme.max_age"),
        ("sweep.json", json.dumps({"sweep_every": HUGE}), "retention.sweep_every"),
        ("minus.json", json.dumps({"default": {"idle": -HUGE}}), "retention.default.idle"),
        ("text.toml", f'[default]\nidle = "{"9" * 400}d"\n', "retention.default.idle"),
    ],
)
def test_a_huge_number_in_a_policy_file_is_exit_5_naming_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, err = run(capsys, "-s", "memory://", "retention", "--dry-run", "--policy", str(path))
    assert code == 5, err
    line = one_line(err)
    assert str(path) in line
    assert where in line
    assert "0" * 50 not in line  # the number is described, not printed whole
    assert "9" * 50 not in line


@pytest.mark.parametrize(
    ("name", "text"),
    [("deep.json", "[" * 100_000 + "]" * 100_000), ("deep.toml", "x = " + "[" * 100_000 + "]" * 100_000)],
)
def test_arrays_nested_past_the_parser_s_depth_are_exit_5_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, err = run(capsys, "-s", "memory://", "retention", "--dry-run", "--policy", str(path))
    assert code == 5, err
    assert str(path) in one_line(err)
    assert "nested too deeply" in err
    with pytest.raises(CliError) as caught:
        load_config(path)  # `convmem serve --config` reads its file the same way
    assert caught.value.code == 5
    assert str(path) in str(caught.value)


def test_a_policy_file_that_is_not_utf8_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[default]\nidle = "90d" # caf\xe9\n')
    code, err = run(capsys, "-s", "memory://", "retention", "--dry-run", "--policy", str(path))
    assert code == 5, err
    line = one_line(err)
    assert str(path) in line
    assert "line 2 is not UTF-8" in line


def test_huge_numbers_from_python_are_invalid_config_naming_the_setting() -> None:
    with pytest.raises(InvalidConfig) as caught:
        convmem.connect("memory://", retention={"default": {"idle": HUGE}})
    assert caught.value.field == "retention.default.idle"
    with pytest.raises(InvalidConfig, match="max_age"):
        RetentionPolicy(max_age=HUGE)
    with pytest.raises(InvalidConfig, match="sweep_every"):
        RetentionPolicies(sweep_every=-HUGE)
    with pytest.raises(InvalidConfig, match=r"health\.degraded_retry_seconds"):
        HealthPolicy(degraded_retry_seconds=HUGE)
    with pytest.raises(InvalidConfig, match=r"health\.retry_backoff_seconds\[0\]"):
        HealthPolicy(retry_backoff_seconds=(HUGE,))
    with pytest.raises(InvalidConfig, match=r"budget\.full_zone_turns"):
        MemoryBudget(full_zone_turns=2**64)  # stored in the session's first event: it must fit
    with pytest.raises(InvalidConfig, match="total_tokens"):
        recommended(total_tokens=HUGE)


def test_a_huge_whole_number_in_a_serve_config_or_flag_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[budget]\nfull_zone_turns = {10**40}\n", encoding="utf-8")
    with pytest.raises(CliError) as caught:
        load_config(path)
    assert caught.value.code == 5
    assert str(path) in str(caught.value)
    assert "budget.full_zone_turns" in str(caught.value)
    code, err = run(capsys, "serve", "--total-tokens", str(HUGE))
    assert code == 2, err
    assert "--total-tokens" in one_line(err)


def test_a_serve_record_nested_too_deeply_is_no_serve_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --local` reads the data folder's record of the serve: a hostile one is exit 4, one line."""
    (tmp_path / "convmem-serve.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    code, err = run(capsys, "--data-dir", str(tmp_path), "-s", "nats://127.0.0.1:1", "status", "--local")
    assert code == 4, err
    assert f"no convmem serve recorded in {tmp_path}" in one_line(err)


def test_a_pending_master_key_file_that_is_not_ascii_is_named(tmp_path: Path) -> None:
    key_file = tmp_path / "master.key"
    key_file.write_text(base64.b64encode(bytes(32)).decode() + "\n", encoding="ascii")
    pending = tmp_path / "master.key.new"
    pending.write_bytes(b"\xff\xfe not a key\n")
    with pytest.raises(EncryptionKeyError) as caught:
        master_key_from_file(key_file)
    assert str(pending) in str(caught.value)


def test_an_erasure_keeps_the_lines_of_an_export_file_it_cannot_parse(tmp_path: Path) -> None:
    """An edited export (bytes that are not UTF-8, arrays nested past the parser's depth) does not stop
    the erasure from dropping the user's lines; the lines it cannot read stay as they are."""
    log = InMemoryEventLog()
    other = MemoryKey("acme", "carol", "chat-1")
    with MemorySystem(CONFIG, log=log) as memory:
        for key in (KEY, other):
            memory.session(key).add_turn(ConversationTurn(user_message="hi", assistant_response="ok"))
    lines = [line.encode() + b"\n" for line in export_jsonl(log.read_all())]
    odd = [b'{"note": "caf\xe9"}\n', b"[" * 100_000 + b"]" * 100_000 + b"\n"]
    exported = tmp_path / "edited.jsonl"
    exported.write_bytes(b"".join(lines + odd))
    registry = FileExportRegistry(tmp_path / "exports.json")
    registry.record(exported, {KEY, other})
    request = ErasureRequest.of("acme", "bob", None, by="ops", at=1.0)
    assert registry.erase_copies(request) == 1
    left = exported.read_bytes()
    assert b'"bob"' not in left
    assert b'"carol"' in left
    assert all(line in left for line in odd)


# -- JSONL exports read back (--from-file) -----------------------------------------------------


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """A real export of one session of three turns (seqs 1-4)."""
    log = InMemoryEventLog()
    with MemorySystem(CONFIG, log=log) as memory:
        for i in range(3):
            memory.session(KEY).add_turn(ConversationTurn(user_message=f"q{i}", assistant_response="a"))
    path = tmp_path / "ok.jsonl"
    path.write_text("".join(line + "\n" for line in export_jsonl(log.read_all())), encoding="utf-8")
    return path


def _with_line(exported: Path, number: int, change: dict[str, object]) -> Path:
    lines = exported.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[number - 1])
    for name, value in change.items():
        if value is _GONE:
            del row[name]
        else:
            row[name] = value
    lines[number - 1] = json.dumps(row)
    path = exported.with_name("bad.jsonl")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


_GONE = object()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"seq": "abc"}, "seq must be a whole number, got 'abc'"),
        ({"seq": [1]}, "seq must be a whole number, got an array"),
        ({"seq": 2.5}, "seq must be a whole number, got 2.5"),
        ({"seq": True}, "seq must be a whole number"),
        ({"seq": -1}, "seq must be from 1"),
        ({"seq": 2**70}, "seq must be from 1"),
        ({"position": 2.7}, "position must be a whole number"),
        ({"position": 0}, "position must be from 1"),
        ({"position": 2**70}, "position must be from 1"),
        ({"position": None}, "it has no position"),
        ({"position": _GONE}, "it has no position"),
    ],
    ids=lambda v: json.dumps(v, default=str)[:30],
)
def test_a_wrong_seq_or_position_is_exit_5_naming_the_file_and_line(
    exported: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], said: str
) -> None:
    bad = _with_line(exported, 2, change)
    for argv in (
        ["replay", KEY.composite(), "--from-file", str(bad)],
        ["verify", "--all", "--from-file", str(bad)],
        ["inspect", KEY.composite(), "--from-file", str(bad)],
    ):
        code, err = run(capsys, *argv)
        assert code == 5, (argv, err)
        line = one_line(err)
        assert f"{bad}:2: " in line
        assert said in line


def test_a_line_nested_past_the_parser_s_depth_or_not_utf8_is_exit_5_naming_the_line(
    exported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = exported.read_bytes().splitlines(keepends=True)
    for name, odd, said in (
        ("nested.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
        ("latin1.jsonl", good[2].replace(b'"q1"', b'"q1 caf\xe9"'), "not UTF-8 text"),
    ):
        bad = exported.with_name(name)
        bad.write_bytes(b"".join([*good[:2], odd, *good[3:]]))
        for argv in (
            ["replay", KEY.composite(), "--from-file", str(bad)],
            ["verify", "--all", "--from-file", str(bad)],
            ["inspect", KEY.composite(), "--from-file", str(bad)],
        ):
            code, err = run(capsys, *argv)
            assert code == 5, (argv, err)
            line = one_line(err)
            assert f"{bad}:3: " in line
            assert said in line


def test_read_jsonl_reads_back_every_line_export_jsonl_writes_and_refuses_a_forged_seq() -> None:
    """A foreign message's seq header out of range (below 1) is exported as null, so it reads back; the
    same seq typed into a line is refused."""
    log = InMemoryEventLog()
    started = SessionStarted(seq=1, event_id="s/1", at=1.0, key=KEY, config=CONFIG)
    log.append(KEY, [started], expected_seq=0)
    log.append_raw(KEY, b"not convmem's", seq=-7)
    lines = list(export_jsonl(log.read_all()))
    assert [json.loads(line)["seq"] for line in lines] == [1, None]
    assert [r.seq for r in read_jsonl(lines)] == [1, None]
    forged = json.loads(lines[1])
    forged["seq"] = -7
    with pytest.raises(InvalidInput) as caught:
        list(read_jsonl([lines[0], json.dumps(forged)], source="f.jsonl"))
    assert caught.value.field == "f.jsonl:2"


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", KEY.composite(), "--position=--"],
        ["fork", KEY.composite(), "--to", "acme:bob:copy", "--position=--"],
        ["sessions", "--limit=--"],
        ["--timeout=--", "sessions"],
        ["inspect", KEY.composite(), "--interval=--"],
    ],
)
def test_an_option_given_double_dash_as_its_value_is_checked_as_any_value(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """argparse (3.11) drops a "--" given as an option's value and stores [] unchecked."""
    code, err = run(capsys, "-s", "memory://", *argv)
    assert code == 2, err
    assert "'--' is not a" in one_line(err)


# -- export of a damaged store -----------------------------------------------------------------


def _seqs(path: Path) -> list[int]:
    return [json.loads(line)["seq"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_export_of_a_damaged_session_writes_what_it_reads_names_the_rest_and_exits_7(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "nats"
    server = EmbeddedNatsServer(store).start()
    try:
        seed(server)
        server.stop()
        flip(store, marker(HURT, 1))  # HURT's second turn: seq 3, which the server then skips
        server.start()
        one = tmp_path / "hurt.jsonl"
        code, out = run(capsys, "-s", server.url, "export", "--key", HURT.composite(), "-o", str(one))
        assert code == 7, out
        assert "acme:alice:hurt: DAMAGED seq 3: event seq 3 missing" in out
        assert f"exported 3 events to {one}, but 1 event(s) of 1 session(s) are damaged or missing" in out
        assert _seqs(one) == [1, 2, 4]
        every = tmp_path / "all.jsonl"
        code, out = run(capsys, "-s", server.url, "export", "--tenant", "acme", "-o", str(every))
        assert code == 7, out
        assert out.count("DAMAGED") == 1
        assert len(_seqs(every)) == 3 * (TURNS + 1) - 1
        code, out = run(capsys, "-s", server.url, "export", "--key", HURT.composite())  # to stdout
        assert code == 7
        assert "DAMAGED seq 3" in out
        code, out = run(capsys, "-s", server.url, "export", "--key", FIRST.composite(), "-o", str(one))
        assert (code, out.strip()) == (0, f"exported {TURNS + 1} events to {one}")
        code, out = run(capsys, "-s", server.url, "repair", HURT.composite(), "--yes")
        assert code == 0, out
        code, out = run(capsys, "-s", server.url, "export", "--key", HURT.composite(), "-o", str(one))
        assert code == 0, out  # the repair covers the damage, as verify says
        assert "DAMAGED" not in out
    finally:
        server.stop()


def test_an_event_that_fails_its_checksum_is_exported_as_raw_bytes_and_named(
    nats_server: EmbeddedNatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = JetStreamEventLog.connect(nats_server.url)
    try:
        log.append(
            LATER, [SessionStarted(seq=1, event_id="s/1", at=1.0, key=LATER, config=CONFIG)], expected_seq=0
        )
        event = TurnAdded(seq=2, event_id="s/2", at=2.0, index=1, turn=turn(LATER, 0))
        data = encode_event(event)
        bad = bytearray(data)
        bad[data.find(b"MARK") + 2] ^= 0x20  # still decodes: only the checksum tells
        position = log.append_raw(
            LATER, bytes(bad), seq=2, checksum=seal(2, event.event_id, data), event_id=event.event_id
        )
    finally:
        log.close()
    path = tmp_path / "later.jsonl"
    code, out = run(capsys, "-s", nats_server.url, "export", "--key", LATER.composite(), "-o", str(path))
    assert code == 7, out
    assert f"acme:bob:later: DAMAGED seq 2, position {position}: " in out
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["seq"] for line in lines] == [1, 2]
    assert "event" not in lines[1]
    assert lines[1]["error"].startswith("damaged: ")
    assert base64.b64decode(lines[1]["raw"]) == bytes(bad)


@pytest.mark.parametrize("kind", ["device", "fifo", "too-large"])
def test_a_settings_file_that_is_no_small_regular_file_is_exit_5_without_reading_it_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A policy, config or master key file named by an option may be a device (``/dev/zero``, which
    a plain read follows until memory runs out), a pipe (which a plain open waits on forever) or a
    file of gigabytes: each is refused, naming the file, before anything is read past the bound."""
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        path = tmp_path / "policy.json"
        os.mkfifo(path)
    else:
        path = tmp_path / "policy.json"
        with path.open("wb") as grown:
            grown.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: nothing is written to the disk
    code, err = run(capsys, "-s", "memory://", "retention", "--dry-run", "--policy", str(path))
    assert code == 5, err
    line = one_line(err)
    assert str(path) in line
    assert ("larger than" if kind == "too-large" else "not a regular file") in line
    with pytest.raises(CliError) as caught:
        load_config(path)  # `convmem serve --config` reads its file the same way
    assert caught.value.code == 5
    with pytest.raises(EncryptionKeyError) as refused:
        master_key_from_file(path)
    assert str(path) in str(refused.value)


def _runtime_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("convmem-nats-*")}


def test_an_embedded_server_that_cannot_start_leaves_no_folder_and_names_a_busy_port(tmp_path: Path) -> None:
    """Given a port another process listens on, or a store another server holds, when an embedded
    server starts there, then it fails naming the cause (the busy port said in words, not a page of
    the server's log) and leaves no runtime folder behind (its conf and log name the store)."""
    before = _runtime_folders()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LogUnavailable) as caught:
            EmbeddedNatsServer(tmp_path / "a", port=port).start()
    message = str(caught.value)
    assert f"port {port} on 127.0.0.1 is in use" in message
    assert len(message) < 300
    with EmbeddedNatsServer(tmp_path / "b") as holder:
        assert holder.running
        with pytest.raises(LogUnavailable):
            EmbeddedNatsServer(tmp_path / "b").start()
    assert _runtime_folders() <= before
