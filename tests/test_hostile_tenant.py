"""A hostile tenant and a hostile operator, with only their own credentials of docker/nats-tenants.conf.

NATS checks the publish permission of a request's subject, never of its reply
subject, and the service answers with its own rights. So every operation is
sent, legally on the sender's own subjects, with its reply aimed at somewhere
else: another tenant's event subjects, the JetStream API (purge, delete),
the key-value bucket, ``$SRV``, ``$SYS``, convmem's request and control
subjects, another principal's inbox, and malformed or look-alike inboxes.
Each time a spy (a user the test adds, allowed everything) hears nothing on
the target, the stream and the bucket keep their message counts, and the
service counts the refusal against the sender. The victim's `verify` stays
clean and its session unchanged. The same probes against an embedded server
without auth (the default, where only the service's own check stands) show
the code refuses them by itself. An operator's flood of made-up worker
announcements changes no partition owner, refused by the server and, from
a user the server lets through, by the workers' signature check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from runtime_helpers import WAIT
from test_service import _free_port, _ready, tenants_config

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, MemoryService, RemoteSession
from convmem.adapters.backends.jetstream._embedded import find_nats_server
from convmem.adapters.backends.jetstream._log import DEFAULT_PREFIX, DEFAULT_STREAM
from convmem.adapters.backends.jetstream._snapshots import DEFAULT_BUCKET
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.service._inboxes import MAX_NAMED_CHARS, OPERATOR, OPERATOR_INBOX
from convmem.adapters.frontends.service._partitions import members_subject, verified
from convmem.adapters.frontends.service._protocol import (
    DEFAULT_API_PREFIX,
    OPERATOR_OPS,
    SESSION_OPS,
    SLOTS,
    operator_subject,
    session_subject,
    status_subject,
)
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
SECRET = b"hostile-suite-members-secret-01"
ACME = MemoryKey("acme", "alice", "chat-1")
VICTIM = MemoryKey("globex", "bob", "chat-9")
SPY = """      # Added by the test: sees every subject of the account, may do anything.
      { user: spy, password: spy-secret }

"""

_IDS = {"user_id": ACME.user_id, "session_id": ACME.session_id}
PAYLOADS: dict[str, dict[str, Any]] = {
    "add_turn": {**_IDS, "turn": {"user_message": "planted", "assistant_response": "ok"}},
    "add_items": {**_IDS, "items": [{"role": "user", "content": "planted"}]},
    "pop_item": _IDS,
    "context": _IDS,
    "tokens": _IDS,
    "views": {**_IDS, "view": "buffer"},
    "flush": _IDS,
    "health": _IDS,
    "clear": _IDS,
    "erase": _IDS,
    "export_state": _IDS,
    "restore": {**_IDS, "state": {"turns": []}},
    "agents_start": _IDS,
    "agents_items": _IDS,
    "sessions": {"user_id": ACME.user_id},
    "fork": {**_IDS, "to_session_id": "forked"},
}
"""A legal request of every session operation, on acme's own session."""

ELSEWHERE = {
    "victim-events": f"{DEFAULT_PREFIX}.{'.'.join(VICTIM.tokens())}",
    "js-purge": f"$JS.API.STREAM.PURGE.{DEFAULT_STREAM}",
    "js-delete": f"$JS.API.STREAM.DELETE.{DEFAULT_STREAM}",
    "js-msg-delete": f"$JS.API.STREAM.MSG.DELETE.{DEFAULT_STREAM}",
    "kv-snapshot": f"$KV.{DEFAULT_BUCKET}.{'.'.join(VICTIM.tokens())}",
    "srv": "$SRV.PING.convmem",
    "sys": "$SYS.REQ.SERVER.PING",
    "victim-request": session_subject(DEFAULT_API_PREFIX, VICTIM.tenant_id, "erase"),
    "operator-request": operator_subject(DEFAULT_API_PREFIX, "health"),
    "control": members_subject(DEFAULT_API_PREFIX),
    "erasure-notices": f"{DEFAULT_PREFIX}.erasures",
    "victim-inbox": "_INBOX_globex.AbC123.1",
    "service-inbox": "_INBOX.AbC123.1",
}
"""Reply subjects that are nobody's to aim at: the same for a tenant and for the operator."""

TENANT_TARGETS = {
    **ELSEWHERE,
    "operator-inbox": f"{OPERATOR_INBOX}.AbC123.1",
    "look-alike-inbox": "_INBOX_acmeX.AbC123.1",  # tenant "acmeX"'s, not acme's
    "bare-own-prefix": "_INBOX_acme",
    "own-wildcard": "_INBOX_acme.>",
    "own-star": "_INBOX_acme.*.1",
    "empty-token": "_INBOX_acme..1",
    "too-long": "_INBOX_acme." + "x" * 400,
    "non-ascii": "_INBOX_acme.\u00e9t\u00e9",
}
OPERATOR_TARGETS = {
    **ELSEWHERE,
    "tenant-inbox": "_INBOX_acme.AbC123.1",
    "look-alike-inbox": f"{OPERATOR_INBOX}X.AbC123.1",
    "bare-own-prefix": OPERATOR_INBOX,
    "own-wildcard": f"{OPERATOR_INBOX}.>",
    "empty-token": f"{OPERATOR_INBOX}..1",
}


def operator_requests(service: MemoryService) -> dict[str, str]:
    """Every subject an operator's request is answered on: its ops, the replica's status, the micro verbs."""
    return {
        **{f"ops.{op}": operator_subject(service.api_prefix, op) for op in OPERATOR_OPS},
        "status": status_subject(service.api_prefix, service.instance),
        "srv-ping-all": "$SRV.PING",
        "srv-ping": "$SRV.PING.convmem",
        "srv-info": "$SRV.INFO.convmem",
        "srv-stats": "$SRV.STATS.convmem",
    }


def test_the_payloads_cover_every_session_operation() -> None:
    assert set(PAYLOADS) == set(SESSION_OPS)


@dataclass
class Deployment:
    """The service on a NATS server, and who may connect: the sender, the operator, the spy."""

    service: MemoryService
    system: MemorySystem
    tenant_url: str
    operator_url: str
    spy_url: str
    auditor_url: str | None = None

    def refused(self, who: str) -> int:
        by: dict[str, int] = self.service.metrics()["service"]["replies"]["by_requester"]
        return by.get(who, 0)


def _url(port: int, user: str) -> str:
    return f"nats://{user}:{user}-secret@127.0.0.1:{port}"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """docker/nats-tenants.conf on a real nats-server (plus the spy), the service as its two users."""
    tmp = tmp_path_factory.mktemp("hostile")
    port, monitor = _free_port(), _free_port()
    text = tenants_config(port, monitor, tmp / "js")
    marker = '      # Tenant "acme"'
    assert marker in text
    (tmp / "tenants.conf").write_text(text.replace(marker, SPY + marker, 1), encoding="utf-8")
    with open(tmp / "nats.log", "wb") as log:
        proc = subprocess.Popen(
            [str(find_nats_server()), "-c", str(tmp / "tenants.conf")], stdout=log, stderr=log
        )
    try:
        while not _ready(monitor):
            try:
                proc.wait(timeout=0.05)
                pytest.fail(f"nats-server exited: {(tmp / 'nats.log').read_text()}")
            except subprocess.TimeoutExpired:
                continue
        store = _url(port, "convmem").replace("convmem-secret", "convmem-service-secret")
        with (
            convmem.connect(store, config=CONFIG) as system,
            MemoryService(
                system, _url(port, "convmem-api"), partitioned=True, members_secret=SECRET
            ) as service,
        ):
            for key in (ACME, VICTIM):
                with RemoteSession(_url(port, key.tenant_id), key, timeout=WAIT) as session:
                    session.add_turn(
                        ConversationTurn(user_message=f"{key.tenant_id} own", assistant_response="ok")
                    )
            yield Deployment(
                service,
                system,
                tenant_url=_url(port, "acme"),
                operator_url=_url(port, "operator"),
                spy_url=_url(port, "spy"),
                auditor_url=_url(port, "auditor"),
            )
    finally:
        proc.terminate()
        proc.wait(WAIT)


async def _counts(spy: Client) -> tuple[int, int]:
    """Messages in the event stream and in the snapshot bucket."""
    found = []
    for stream in (DEFAULT_STREAM, f"KV_{DEFAULT_BUCKET}"):
        reply = await spy.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=WAIT)
        found.append(int(json.loads(reply.data)["state"]["messages"]))
    return found[0], found[1]


class Noted(list[str]):
    """What a connection's callback noted, on the test's loop; `until` waits for it (woken, not polling)."""

    def __init__(self) -> None:
        super().__init__()
        self._grew = asyncio.Event()

    def note(self, what: str) -> None:
        self.append(what)
        self._grew.set()

    async def until(self, n: int, what: str) -> None:
        """Until `n` things are noted; fails the test after WAIT."""
        try:
            async with asyncio.timeout(WAIT):
                while len(self) < n:
                    self._grew.clear()
                    await self._grew.wait()
        except TimeoutError:
            raise AssertionError(f"{what}: {len(self)} of {n} within {WAIT:g}s: {list(self)}") from None


async def _until(deployment: Deployment, fact: Callable[[], bool], what: str) -> None:
    """Until `fact` (about the service's counters) holds: re-checked when the service announces a change
    of its counters (`MemoryService.wait_for`), never polled; fails the test after WAIT."""
    held = await asyncio.to_thread(deployment.service.wait_for, fact, WAIT)
    assert held, f"{what}: not within {WAIT:g}s"


def _own_beat(deployment: Deployment, data: bytes) -> bool:
    """Whether a message is the worker's own membership announcement (on the control subject)."""
    said = verified(SECRET, data)
    return said is not None and said.get("instance") == deployment.service.instance


def _answer_like(data: bytes) -> bool:
    """Whether a message looks like anything the service answers: a protocol reply, a micro one, a status."""
    return data.startswith((b'{"v":1', b'{"health"')) or b"io.nats.micro" in data


async def _probe(
    deployment: Deployment, sender_url: str, subject: str, payload: bytes, target: str, who: str
) -> tuple[list[str], tuple[int, int], tuple[int, int], int]:
    """Send one request with reply subject `target`; wait for the service to refuse it; let a legal
    request round-trip after it. What the spy heard on `target`, the store's counts before and after,
    and how many refusals were counted against `who`."""
    seen: list[tuple[str, bytes]] = []

    async def on_message(msg: Msg) -> None:
        seen.append((msg.subject, msg.data))

    spy = await nats.connect(deployment.spy_url)
    sender = await nats.connect(sender_url)
    try:
        await spy.subscribe(">", cb=on_message)
        await spy.flush()
        before = await _counts(spy)
        refused = deployment.refused(who)
        await sender.publish(subject, payload, reply=target)
        await sender.flush()
        await _until(
            deployment, lambda: deployment.refused(who) > refused, f"the service refusing {target!r}"
        )
        legal = await nats.connect(deployment.tenant_url, inbox_prefix="_INBOX_acme")
        try:
            api = deployment.service.api_prefix
            answer = await legal.request(f"{api}.v1.acme.health", json.dumps(_IDS).encode(), timeout=WAIT)
            assert json.loads(answer.data)["ok"] is True
        finally:
            await legal.close()
        await spy.flush()
        after = await _counts(spy)
        seen.remove((subject, payload))  # the hostile request itself, heard on its own subject
        heard = [
            s
            for s, data in seen
            if (s == target and not _own_beat(deployment, data))
            or (s != answer.subject and _answer_like(data))
        ]
        return heard, before, after, deployment.refused(who) - refused
    finally:
        await sender.close()
        await spy.close()


@pytest.mark.parametrize("target", TENANT_TARGETS.values(), ids=list(TENANT_TARGETS))
@pytest.mark.parametrize("op", SESSION_OPS)
def test_a_tenant_cannot_aim_any_reply_elsewhere(shipped: Deployment, op: str, target: str) -> None:
    subject = session_subject(shipped.service.api_prefix, ACME.tenant_id, op)
    heard, before, after, refused = asyncio.run(
        _probe(shipped, shipped.tenant_url, subject, json.dumps(PAYLOADS[op]).encode(), target, "acme")
    )
    assert heard == []
    assert after == before
    assert refused == 1


@pytest.mark.parametrize("target", OPERATOR_TARGETS.values(), ids=list(OPERATOR_TARGETS))
@pytest.mark.parametrize(
    "request_", ["ops.health", "ops.metrics", "status", "srv-ping-all", "srv-ping", "srv-info", "srv-stats"]
)
def test_an_operator_cannot_aim_any_reply_elsewhere(shipped: Deployment, request_: str, target: str) -> None:
    subject = operator_requests(shipped.service)[request_]
    heard, before, after, refused = asyncio.run(
        _probe(shipped, shipped.operator_url, subject, b"", target, OPERATOR)
    )
    assert heard == []
    assert after == before
    assert refused == 1


def test_every_operator_request_is_probed(shipped: Deployment) -> None:
    assert set(operator_requests(shipped.service)) == {
        "ops.health",
        "ops.metrics",
        "status",
        "srv-ping-all",
        "srv-ping",
        "srv-info",
        "srv-stats",
    }


def test_the_victim_verifies_clean_and_nothing_the_attacker_asked_for_ran(
    shipped: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every operation aimed at globex's events, the purge API and the bucket: globex's session and
    acme's own are exactly what their owners wrote, `verify` of globex is clean."""
    aimed = ("victim-events", "js-purge", "js-msg-delete", "kv-snapshot")

    async def attack() -> int:
        refused = shipped.refused("acme")
        sender = await nats.connect(shipped.tenant_url)
        try:
            for op in SESSION_OPS:
                for name in aimed:
                    subject = session_subject(shipped.service.api_prefix, ACME.tenant_id, op)
                    await sender.publish(
                        subject, json.dumps(PAYLOADS[op]).encode(), reply=TENANT_TARGETS[name]
                    )
            await sender.flush()
        finally:
            await sender.close()
        total = len(SESSION_OPS) * len(aimed)
        await _until(shipped, lambda: shipped.refused("acme") == refused + total, "every request refused")
        return total

    asyncio.run(attack())
    with RemoteSession(shipped.tenant_url.replace("acme", "globex"), VICTIM, timeout=WAIT) as victim:
        assert [t["user_message"] for t in victim.to_dict()["turns"]] == ["globex own"]
    with RemoteSession(shipped.tenant_url, ACME, timeout=WAIT) as own:
        assert [t["user_message"] for t in own.to_dict()["turns"]] == ["acme own"]  # no add, clear, erase
    assert shipped.auditor_url is not None
    flags = ["-s", shipped.auditor_url, "--inbox-prefix", "_AUDIT_INBOX", "--timeout", "5"]
    assert main(["verify", VICTIM.composite(), *flags]) == 0, capsys.readouterr().err
    assert main(["verify", "--all", *flags]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "target",
    [ELSEWHERE[n] for n in ELSEWHERE if n not in ("victim-inbox", "control")],
    ids=[n for n in ELSEWHERE if n not in ("victim-inbox", "control")],
)
def test_even_a_defect_of_the_responder_cannot_publish_there(shipped: Deployment, target: str) -> None:
    """The configuration's own line: the responder identity (what answers requests) is refused by the
    server on every subject but the inboxes and the control subject, and the store identity (what
    writes JetStream) may not receive a request, so it never answers one."""
    port = shipped.spy_url.rsplit(":", 1)[1]
    responder = f"nats://convmem-api:convmem-api-secret@127.0.0.1:{port}"
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{port}"

    async def scenario() -> tuple[list[str], list[str], tuple[int, int], tuple[int, int]]:
        errors = Noted()
        seen: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.note(str(exc).lower())

        async def on_message(msg: Msg) -> None:
            if msg.subject == target:
                seen.append(msg.subject)

        spy = await nats.connect(shipped.spy_url)
        api = await nats.connect(responder, error_cb=on_error)
        writer = await nats.connect(store, error_cb=on_error)
        try:
            await spy.subscribe(">", cb=on_message)
            await spy.flush()
            before = await _counts(spy)
            await api.publish(target, b'{"v":1,"ok":true,"result":null}')
            await api.flush()
            await writer.subscribe(f"{DEFAULT_API_PREFIX}.v1.>")
            await writer.flush()
            await errors.until(2, "both refused")
            await spy.flush()
            return errors, seen, before, await _counts(spy)
        finally:
            for nc in (writer, api, spy):
                await nc.close()

    errors, seen, before, after = asyncio.run(scenario())
    assert seen == []
    assert after == before
    assert any("publish" in e for e in errors), errors
    assert any("subscription" in e and "convmem.api.v1" in e for e in errors), errors


def test_a_tenant_reaches_no_operator_or_micro_subject(shipped: Deployment) -> None:
    """acme's own credentials: every operator subject and every NATS micro verb (all services, this
    kind, this replica) is refused by the server, as is listening on the operators' inbox; the spy,
    allowed everything, hears none of them, so no replica ran or answered one (no amplification, no
    stats computed at a tenant's rate, no other tenant's name in a reply it could read)."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        operator = await nats.connect(shipped.operator_url, inbox_prefix=OPERATOR_INBOX)
        try:
            ping = json.loads((await operator.request("$SRV.PING.convmem", b"", timeout=WAIT)).data)
        finally:
            await operator.close()
        micro = f"convmem.{ping['id']}"
        subjects = [
            *operator_requests(shipped.service).values(),
            *(f"$SRV.{verb}" for verb in ("INFO", "STATS")),
            *(f"$SRV.{verb}.{micro}" for verb in ("PING", "INFO", "STATS")),
            f"{DEFAULT_API_PREFIX}.ops.v1.erase",
        ]
        errors = Noted()
        heard: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.note(str(exc))

        async def on_message(msg: Msg) -> None:
            if msg.subject in subjects:
                heard.append(msg.subject)

        spy = await nats.connect(shipped.spy_url)
        tenant = await nats.connect(shipped.tenant_url, inbox_prefix="_INBOX_acme", error_cb=on_error)
        try:
            await spy.subscribe(">", cb=on_message)
            await spy.flush()
            await tenant.subscribe(f"{OPERATOR_INBOX}.>")
            for subject in subjects:
                await tenant.publish(subject, b"", reply=f"{OPERATOR_INBOX}.AbC123.1")
            await tenant.flush()
            await errors.until(len(subjects) + 1, "every publish and the subscription refused")
            await spy.flush()
            return subjects, errors, heard
        finally:
            await tenant.close()
            await spy.close()

    before = shipped.service.metrics()["service"]["by_op"]
    subjects, errors, heard = asyncio.run(scenario())
    assert heard == []
    said = [e.lower() for e in errors]  # nats-py lowers the server's words
    refused = sorted(e.split("publish to ")[-1].strip('"') for e in said if "publish to" in e)
    assert refused == sorted(s.lower() for s in subjects), errors
    assert [e for e in errors if f'subscription to "{OPERATOR_INBOX.lower()}.>"' in e.lower()], errors
    after = shipped.service.metrics()["service"]["by_op"]
    assert {k: v for k, v in after.items() if k.startswith("ops.")} == {
        k: v for k, v in before.items() if k.startswith("ops.")
    }


def test_the_operator_runs_no_session_operation(shipped: Deployment) -> None:
    """The operator's credentials: a session operation under the operator subjects
    (``ops.v1.erase``...) is answered UnknownOperation and runs nothing (``health`` is the
    service's); on a tenant's subject the server refuses it. The store keeps its counts; acme's
    session keeps its turn."""

    async def scenario() -> tuple[list[str], list[str], tuple[int, int], tuple[int, int]]:
        errors = Noted()

        async def on_error(exc: Exception) -> None:
            errors.note(str(exc))

        spy = await nats.connect(shipped.spy_url)
        operator = await nats.connect(shipped.operator_url, inbox_prefix=OPERATOR_INBOX, error_cb=on_error)
        try:
            before = await _counts(spy)
            types = []
            for op in SESSION_OPS:
                subject = f"{shipped.service.api_prefix}.ops.v1.{op}"
                reply = await operator.request(subject, json.dumps(PAYLOADS[op]).encode(), timeout=WAIT)
                body = json.loads(reply.data)
                types.append("ok" if body["ok"] else body["error"]["type"])
            await operator.publish(
                session_subject(shipped.service.api_prefix, ACME.tenant_id, "erase"),
                json.dumps(PAYLOADS["erase"]).encode(),
            )
            await operator.flush()
            await errors.until(1, "the tenant subject refused")
            return types, errors, before, await _counts(spy)
        finally:
            await operator.close()
            await spy.close()

    types, errors, before, after = asyncio.run(scenario())
    assert types == ["ok" if op in OPERATOR_OPS else "UnknownOperation" for op in SESSION_OPS]
    assert after == before
    assert any("publish to" in e.lower() and ".v1.acme.erase" in e for e in errors), errors
    with RemoteSession(shipped.tenant_url, ACME, timeout=WAIT) as own:
        assert [t["user_message"] for t in own.to_dict()["turns"]] == ["acme own"]


# The embedded default: no auth, the service's own check alone --------------------------------------


@pytest.fixture
def unguarded(nats_server: EmbeddedNatsServer) -> Iterator[Deployment]:
    """A service on an embedded server without auth: every client may publish anywhere."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    with (
        convmem.connect(nats_server.url, config=CONFIG) as system,
        MemoryService(system, nats_server.url, api_prefix=prefix) as service,
    ):
        yield Deployment(service, system, nats_server.url, nats_server.url, nats_server.url)


@pytest.mark.parametrize(
    "target", ["victim-events", "js-purge", "victim-inbox", "service-inbox", "foreign-inbox"]
)
@pytest.mark.parametrize("op", ["add_turn", "export_state", "erase", "ops.health", "srv-info"])
def test_without_auth_the_service_still_answers_only_the_requesters_inbox(
    unguarded: Deployment, op: str, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing on the server stops a client here: the refusals are the service's own, logged with
    the requester."""
    caplog.set_level(logging.WARNING, logger="convmem.service")
    if op.startswith(("ops.", "srv-")):
        subject, payload, who = operator_requests(unguarded.service)[op], b"", OPERATOR
        target = OPERATOR_TARGETS["tenant-inbox" if target == "foreign-inbox" else target]
    else:
        subject = session_subject(unguarded.service.api_prefix, ACME.tenant_id, op)
        payload, who = json.dumps(PAYLOADS[op]).encode(), "acme"
        target = TENANT_TARGETS["operator-inbox" if target == "foreign-inbox" else target]
    heard, _, _, refused = asyncio.run(_probe(unguarded, unguarded.tenant_url, subject, payload, target, who))
    assert heard == []
    assert refused == 1
    named = "the operator" if who == OPERATOR else "tenant 'acme'"
    assert [r for r in caplog.records if "refused a request of " + named in r.getMessage()]


def test_made_up_tenants_cannot_swell_the_operators_replies(unguarded: Deployment) -> None:
    """Where a client may publish under any tenant token (no auth here; a deployment with one
    credential for every tenant), 1,100 refused requests, each naming a tenant of 1,100 characters,
    once grew the refusals' names in metrics, status and $SRV.STATS past max_payload: every replica's
    status 'unhealthy: MaxPayloadError()' (`convmem status` exit 4, a failed health check), metrics
    ReplyTooLarge, $SRV.STATS unanswered. The names kept are bounded in characters; the rest are
    counted under "(others)", and every reply is answered."""
    service, n = unguarded.service, 1100

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        sender = await nats.connect(unguarded.tenant_url)
        try:
            for i in range(n):
                subject = session_subject(service.api_prefix, f"t{i:04d}" + "x" * n, "health")
                await sender.publish(subject, b"{}", reply="_JUNK.AbC123.1")
            await sender.flush()
        finally:
            await sender.close()
        await _until(unguarded, lambda: service.metrics()["service"]["replies"]["refused"] >= n, "refused")
        operator = await nats.connect(unguarded.operator_url, inbox_prefix=OPERATOR_INBOX)
        try:
            answers = []
            for subject in (
                operator_subject(service.api_prefix, "metrics"),
                status_subject(service.api_prefix, service.instance),
                "$SRV.STATS.convmem",
            ):
                reply = await operator.request(subject, b"", timeout=WAIT)
                assert not (reply.headers or {}).get("Nats-Service-Error"), reply.headers
                answers.append(json.loads(reply.data))
            return answers[0], answers[1], answers[2]
        finally:
            await operator.close()

    metrics, status, stats = asyncio.run(scenario())
    assert metrics["ok"] is True
    replies = metrics["result"]["service"]["replies"]
    assert status["metrics"]["service"]["replies"] == replies
    assert stats["endpoints"][0]["data"]["replies"]["refused"] == n
    by = replies["by_requester"]
    assert sum(by.values()) == replies["refused"] == n
    assert by["(others)"] > 0
    assert sum(len(name) for name in by) <= MAX_NAMED_CHARS + len("(others)")


# Control subjects ----------------------------------------------------------------------------------


def test_an_operators_flood_of_worker_announcements_changes_no_owner(shipped: Deployment) -> None:
    """The operator may read status but not announce a worker: its flood on the control subject (and on
    the old one under ops) is refused by the server; the same flood from a user the server lets
    through is dropped by the workers' signature check. The worker keeps every partition."""
    flood = 2000
    worker = shipped.service
    api = worker.api_prefix
    fake = json.dumps({"instance": "zz-fake", "queue_group": "convmem", "leaving": False}).encode()

    async def scenario() -> tuple[int, int]:
        denied = Noted()

        async def on_error(exc: Exception) -> None:
            if "permissions violation" in str(exc).lower():
                denied.note(str(exc))

        operator = await nats.connect(shipped.operator_url, error_cb=on_error)
        spy = await nats.connect(shipped.spy_url)
        try:
            before = worker.worker()["rejected"]
            for n in range(flood):
                subject = members_subject(api) if n % 2 else f"{api}.ops.members"
                await operator.publish(subject, fake.replace(b"zz-fake", f"fake-{n}".encode()))
            await operator.flush()
            await denied.until(1, "the server refusing the operator")
            # The operator's publishes were all handled (dropped) by the server before its flush returned;
            # anything of them routed to the worker would reach it before the spy's, sent after.
            for n in range(flood):
                await spy.publish(members_subject(api), fake.replace(b"zz-fake", f"spy-{n}".encode()))
            await spy.flush()
            await _until(
                shipped,
                lambda: worker.worker()["rejected"] >= before + flood,
                "the worker dropping the flood",
            )
            return worker.worker()["rejected"] - before, len(denied)
        finally:
            await operator.close()
            await spy.close()

    dropped, denied = asyncio.run(scenario())
    assert dropped == flood  # the spy's, each; none of the operator's reached the worker
    assert denied >= 1
    assert worker.worker()["partitions"] == SLOTS
    assert worker.worker()["members"] == 1
    with RemoteSession(shipped.tenant_url, ACME, timeout=WAIT) as own:
        assert own.get_llm_context()["conversation_memory"]  # tenants still served


def test_operators_and_tenants_cannot_use_the_control_subject(shipped: Deployment) -> None:
    """Publish and subscribe on the control subject are refused by the server to tenant and operator."""

    async def scenario(url: str) -> list[str]:
        errors = Noted()

        async def on_error(exc: Exception) -> None:
            errors.note(str(exc).lower())

        nc = await nats.connect(url, error_cb=on_error)
        try:
            await nc.subscribe(members_subject(DEFAULT_API_PREFIX))
            await nc.publish(members_subject(DEFAULT_API_PREFIX), b"x")
            await nc.flush()
            await errors.until(2, "both refused")
        finally:
            await nc.close()
        return errors

    for url in (shipped.operator_url, shipped.tenant_url):
        errors = asyncio.run(scenario(url))
        assert any("subscription" in e and "ctl.members" in e for e in errors), errors
        assert any("publish" in e and "ctl.members" in e for e in errors), errors
