"""The roles of docker/nats-tenants.conf on a real server: service, auditor, operator, tenants.

Each role runs the CLI (or the client) as shipped, with its own inbox prefix,
and is checked for what it may do and for what the server refuses it, the
refused subject named in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_service import tenants_server  # noqa: F401  # the fixture: the shipped file on a real server

import convmem
from convmem.adapters import MemoryService, PermissionDenied, RemoteSession
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
ACME = MemoryKey("acme", "alice", "chat-1")
GLOBEX = MemoryKey("globex", "bob", "chat-9")


def url(port: int, user: str) -> str:
    return f"nats://{user}:{user}-secret@127.0.0.1:{port}"


def cli(capsys: pytest.CaptureFixture[str], port: int, role: str, *argv: str) -> tuple[int, str, str]:
    inbox = {"auditor": "_AUDIT_INBOX", "operator": "_OPS_INBOX"}.get(role)
    flags = ["-s", url(port, role), "--timeout", "3", *(["--inbox-prefix", inbox] if inbox else [])]
    code = main([*argv, *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def deployed(tenants_server: int) -> Iterator[int]:  # noqa: F811
    """The service's two users serving (the store and the responder), one session of each tenant stored."""
    store_url = url(tenants_server, "convmem").replace("convmem-secret", "convmem-service-secret")
    with (
        convmem.connect(store_url, config=CONFIG) as memory,
        MemoryService(memory, url(tenants_server, "convmem-api")),
    ):
        for key in (ACME, GLOBEX):
            with RemoteSession(url(tenants_server, key.tenant_id), key) as s:
                s.add_turn(ConversationTurn(user_message=f"{key.tenant_id} says hi", assistant_response="ok"))
        yield tenants_server


def test_the_auditor_reads_every_session_and_changes_nothing(
    deployed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """sessions, replay, verify, inspect, export work for the auditor; erase is refused, subject named."""
    code, out, err = cli(capsys, deployed, "auditor", "sessions", "--json")
    assert code == 0, err
    assert {row["key"] for row in json.loads(out)} == {ACME.composite(), GLOBEX.composite()}
    for argv in (
        ["replay", GLOBEX.composite()],
        ["verify", "--all"],
        ["inspect", ACME.composite(), "--full"],
        ["export", "--tenant", "acme"],
    ):
        code, _, err = cli(capsys, deployed, "auditor", *argv)
        assert code == 0, (argv, err)
    code, _, err = cli(capsys, deployed, "auditor", "erase", "--key", ACME.composite(), "--yes")
    assert code == 4
    assert err.count("\n") == 1
    assert "refused" in err
    # Refused at its first write: the erasure's record in the journal, before anything is deleted.
    assert "$JS.API" in err or "convmem.ev." in err or "$KV.CONVMEM_EVENTS_ERASURES." in err, err
    assert cli(capsys, deployed, "auditor", "replay", ACME.composite())[0] == 0  # still there


def test_the_operator_sees_status_and_no_session(deployed: int, capsys: pytest.CaptureFixture[str]) -> None:
    """status works for the operator; reading the log is refused with the refused subject named."""
    code, out, err = cli(capsys, deployed, "operator", "status", "--json")
    assert code == 0, err
    assert [r["health"]["status"] for r in json.loads(out)["replicas"]] == ["ok"]
    code, _, err = cli(capsys, deployed, "operator", "replay", ACME.composite())
    assert code == 4
    assert "refused" in err
    assert "$JS.API.INFO" in err
    assert err.count("\n") == 1


def test_a_tenant_still_cannot_reach_another_tenants_session(deployed: int) -> None:
    """acme's credentials address only acme's sessions: globex's session is refused, the refused subject
    named (globex's inbox, where the reply would come: the server refuses it to acme before the request)."""
    with (
        RemoteSession(url(deployed, "acme"), GLOBEX, timeout=3) as session,
        pytest.raises(PermissionDenied) as refused,
    ):
        session.get_llm_context()
    assert refused.value.subject.startswith("_INBOX_globex.")
    with (
        RemoteSession(url(deployed, "acme"), GLOBEX, inbox_prefix="_INBOX_acme", timeout=3) as session,
        pytest.raises(PermissionDenied, match="_INBOX_globex"),
    ):
        session.get_llm_context()


def test_the_cli_of_a_tenant_cannot_read_the_log(deployed: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A tenant's credentials reach no JetStream subject: the CLI says which one was refused."""
    code = main(["-s", url(deployed, "acme"), "--inbox-prefix", "_INBOX_acme", "--timeout", "3", "sessions"])
    _, err = capsys.readouterr()
    assert code == 4
    assert "$JS.API.INFO" in err
