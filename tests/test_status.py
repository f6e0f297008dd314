"""`convmem status`: every replica, found through the NATS micro-services protocol, each asked for itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, MemoryService
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.service._inboxes import OPERATOR_INBOX
from convmem.events import MemoryKey

WAIT = 60.0
CLI = [sys.executable, "-m", "convmem"]


class HangingLog(InMemoryEventLog):
    """An in-memory log whose `last_seq` hangs while `hang` is set (a replica whose log froze)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()

    def last_seq(self, key: MemoryKey) -> int:
        if self.hang.is_set():
            self.release.wait(WAIT)
        return super().last_seq(key)


@pytest.fixture
def replicas(nats_server: EmbeddedNatsServer) -> Iterator[tuple[str, HangingLog]]:
    """Two service replicas on one server: one on the JetStream log, one on a log that can hang."""
    hanging = HangingLog()
    with (
        convmem.connect(nats_server.url) as healthy,
        MemorySystem(log=hanging) as frozen,
        MemoryService(healthy, nats_server.url),
        MemoryService(frozen, nats_server.url, status_timeout=0.5),
    ):
        try:
            yield nats_server.url, hanging
        finally:
            hanging.release.set()


def status(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["-s", url, "status", "--json", *argv])
    return code, json.loads(capsys.readouterr()[0])


def test_status_shows_every_replica_and_a_hung_one_as_such(
    replicas: tuple[str, HangingLog], capsys: pytest.CaptureFixture[str]
) -> None:
    """Both replicas answer; when one's log hangs it is shown unhealthy and status exits 4."""
    url, hanging = replicas
    code, report = status(capsys, url)
    assert code == 0
    assert report["answered"] == 2
    rows = report["replicas"]
    assert isinstance(rows, list)
    assert [row["health"]["status"] for row in rows] == ["ok", "ok"]
    hanging.hang.set()
    code, report = status(capsys, url)
    assert code == 4
    rows = report["replicas"]
    assert isinstance(rows, list)
    assert sorted(str(row["problem"]) for row in rows) == [
        "None",
        "unhealthy: this replica did not get its log's answer within 0.5s",
    ]
    code, report = status(capsys, url, "--expect", "3")  # one more expected than there are
    assert code == 4
    assert any(row["problem"] == "silent: did not answer the ping" for row in report["replicas"])  # type: ignore[union-attr]


def test_the_replicas_are_nats_micro_services(replicas: tuple[str, HangingLog]) -> None:
    """$SRV.PING.convmem and $SRV.STATS.convmem answer for each replica on the operators' inbox (what
    `nats --inbox-prefix _OPS_INBOX micro ls` asks)."""
    url, _ = replicas

    async def ask(subject: str) -> list[dict[str, object]]:
        client = await nats.connect(url, inbox_prefix=OPERATOR_INBOX)
        answers: list[dict[str, object]] = []
        done = asyncio.Event()

        async def collect(msg: nats.aio.msg.Msg) -> None:
            answers.append(json.loads(msg.data))
            if len(answers) == 2:
                done.set()

        inbox = client.new_inbox()
        await client.subscribe(inbox, cb=collect)
        await client.publish(subject, b"", reply=inbox)
        await asyncio.wait_for(done.wait(), WAIT)
        await client.close()
        return answers

    pings = asyncio.run(ask("$SRV.PING.convmem"))
    assert {p["name"] for p in pings} == {"convmem"}
    assert len({p["metadata"]["instance"] for p in pings}) == 2  # type: ignore[index]
    stats = asyncio.run(ask("$SRV.STATS.convmem"))
    assert all(s["endpoints"][0]["name"] == "status" for s in stats)  # type: ignore[index]


def test_status_local_asks_the_replica_of_this_data_folder(
    nats_server: EmbeddedNatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve records its workers in its data folder; status --local asks those only, each showing itself."""
    ready = tmp_path / "ready"
    with open(tmp_path / "serve.err", "wb") as err:
        proc = subprocess.Popen(
            [
                *CLI,
                "-s",
                nats_server.url,
                "--data-dir",
                str(tmp_path / "data"),
                "serve",
                "--ready-file",
                str(ready),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        while not ready.exists():
            try:
                code = proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"serve exited with {code}: {(tmp_path / 'serve.err').read_text()}")
        recorded = json.loads((tmp_path / "data" / "convmem-serve.json").read_text())
        with convmem.connect(nats_server.url) as other, MemoryService(other, nats_server.url):
            code, report = status(capsys, nats_server.url, "--local", "--data-dir", str(tmp_path / "data"))
            assert code == 0
            rows: list[dict[str, Any]] = report["replicas"]  # type: ignore[assignment]
            assert [row["instance"] for row in rows] == sorted(recorded["workers"])
            assert len(rows) == len(os.sched_getaffinity(0))  # --workers defaults to the cores
            assert {row["health"]["worker"]["serve"] for row in rows} == {recorded["serve"]}
            assert sorted(row["health"]["worker"]["index"] for row in rows) == list(range(len(rows)))
    finally:
        proc.terminate()
        proc.wait(WAIT)
    code = main(["-s", nats_server.url, "status", "--local", "--data-dir", str(tmp_path / "data")])
    assert code == 4  # the recorded serve is gone
    assert "not running" in capsys.readouterr()[1]
