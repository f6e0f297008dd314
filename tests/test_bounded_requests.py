"""Requests whose cost on the shared service was the tenant's to choose, now bounded.

On the shipped tenants configuration (a real nats-server), with only the
tenant's own credentials:

* ``sessions`` lists every session in pages of at most `MAX_LISTED`, after a
  cursor (the last key of the previous page), each page folding at most that
  many sessions, the reply saying whether more remain;
* ``agents_items`` reaching past the live turns reads the session's whole
  history from the log only when it holds at most `MAX_HISTORY_EVENTS` events,
  else MalformedRequest names ``limit`` (a limit within the live turns is
  served with no read of the log);
* ``agents_start`` with ``agents.cross_session_injection`` loads at most
  `MAX_INJECTION_SOURCES` of the user's other sessions.

The bounds are lowered for the tests; the work is counted (log reads, loads),
never timed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from runtime_helpers import WAIT
from test_service import _user, tenants_server  # noqa: F401 (the fixture: the shipped file on a real server)

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import ConvmemSession, MemoryService, RemoteMemory
from convmem.adapters.frontends import _views as views
from convmem.adapters.frontends.service import _operations as operations
from convmem.adapters.frontends.service._errors import MalformedRequest
from convmem.events import AgentsMemoryConfig, ConversationTurn, MemoryKey, ShortTermMemoryConfig
from convmem.projections._horizon import live_horizon

CONFIG = ShortTermMemoryConfig(
    strategy="truncation", live_turns=3, agents=AgentsMemoryConfig(cross_session_injection=True)
)


@pytest.fixture
def served(tenants_server: int) -> Iterator[tuple[int, MemorySystem]]:  # noqa: F811
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(store, config=CONFIG)
    try:
        with MemoryService(memory, _user(tenants_server, "convmem-api")):
            yield tenants_server, memory
    finally:
        memory.close()


def _turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


def _count_reads(memory: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> Counter[MemoryKey]:
    """The server's reads of each session's subject, counted as they are made (the log is real)."""
    reads: Counter[MemoryKey] = Counter()
    read = memory.log.read

    def counted(key: MemoryKey, **kwargs: Any) -> Any:
        reads[key] += 1
        return read(key, **kwargs)

    monkeypatch.setattr(memory.log, "read", counted)
    return reads


# sessions: pages after a cursor -----------------------------------------------------------------------


def test_every_session_is_listed_in_pages_each_folding_at_most_max_listed(
    served: tuple[int, MemorySystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant with more sessions than one request lists sees them all, in key order, a page after
    another; each page reads at most MAX_LISTED sessions and says whether more remain."""
    monkeypatch.setattr(operations, "MAX_LISTED", 5)
    port, memory = served
    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as acme:
        keys = [MemoryKey("acme", user, f"s{n:02}") for user in ("alice", "bob") for n in range(6)]
        for key in keys:
            acme.session(key).add_turn(_turn(key.session_id))
        reads = _count_reads(memory, monkeypatch)
        pages: list[dict[str, Any]] = []
        after: dict[str, str] | None = None
        while (not pages or pages[-1]["more"]) and len(pages) < 4:  # three pages, or a cursor ignored
            before = sum(reads.values())
            pages.append(acme.sessions_page("acme", after=after))
            assert sum(reads.values()) - before <= 5  # one read a session listed, at most MAX_LISTED
            after = pages[-1]["after"]
        listed = [(row["user_id"], row["session_id"]) for page in pages for row in page["sessions"]]
        assert listed == [(k.user_id, k.session_id) for k in keys]
        assert [len(page["sessions"]) for page in pages] == [5, 5, 2]
        assert [page["more"] for page in pages] == [True, True, False]
        assert pages[0]["after"] == {"user_id": "alice", "session_id": "s04"}
        assert pages[-1]["after"] is None
        assert [r["session_id"] for r in acme.all_sessions("acme", "bob", page_size=4)] == [
            f"s{n:02}" for n in range(6)
        ]
        third = acme.sessions_page("acme", after={"user_id": "bob", "session_id": "s03"}, limit=1)
        assert [r["session_id"] for r in third["sessions"]] == ["s04"]
        assert third["more"]
        with pytest.raises(MalformedRequest, match=r"give after \(null for the first page\)") as refused:
            acme.sessions("acme")  # no cursor, no limit: the old reply, refused past the bound
        assert refused.value.field == "limit"


@pytest.mark.parametrize(
    ("after", "field"),
    [
        ({"user_id": "", "session_id": "s"}, "after.user_id"),
        ({"user_id": "alice", "session_id": "x" * 300}, "after.session_id"),
        ({"user_id": "alice"}, "after.session_id"),
        ({"user_id": "alice", "session_id": "s", "tenant_id": "globex"}, "after"),  # unknown field
        ("alice/s", "after"),
    ],
)
def test_a_bad_cursor_is_refused_naming_its_field(
    served: tuple[int, MemorySystem], after: Any, field: str
) -> None:
    """A cursor that is not {user_id, session_id} of usable ids is MalformedRequest naming the field;
    nothing is read or stored."""
    port, memory = served
    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as acme:
        with pytest.raises(MalformedRequest) as refused:
            acme.sessions_page("acme", after=after)
        assert refused.value.field == field
        with pytest.raises(MalformedRequest) as refused:
            acme.sessions_page("acme", limit=0)
        assert refused.value.field == "limit"
    assert memory.log.keys(tenant_id="acme") == []


# agents_items past the live turns ---------------------------------------------------------------------


def _pair(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]


def test_items_past_the_live_turns_are_read_only_up_to_max_history_events(
    served: tuple[int, MemorySystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_items() on a session longer than its live turns reads its history from the log while it
    holds at most MAX_HISTORY_EVENTS events; past that, MalformedRequest names limit (and what limit
    is served) and the log is not read; get_items(limit) within the live turns reads nothing."""
    live = live_horizon(CONFIG)
    assert live is not None
    most = live + 5
    monkeypatch.setattr(operations, "MAX_HISTORY_EVENTS", most)
    port, memory = served
    short, long = MemoryKey("acme", "ada", "short"), MemoryKey("acme", "ada", "long")

    async def scenario(remote: RemoteMemory) -> None:
        within = ConvmemSession(short.session_id, remote, tenant_id="acme", user_id="ada")
        past = ConvmemSession(long.session_id, remote, tenant_id="acme", user_id="ada")
        for n in range(live + 2):
            await within.add_items(_pair(n))
        for n in range(most + 1):
            await past.add_items(_pair(n))
        reads = _count_reads(memory, monkeypatch)
        every = await within.get_items()  # past its live turns, within the bound: read whole
        assert [i["content"] for i in every] == [f"{k}{n}" for n in range(live + 2) for k in "qa"]
        assert reads[short] == 1
        seq = memory.log.last_seq(long)
        assert seq > most
        with pytest.raises(MalformedRequest, match=rf"more than the {most} .* at most {2 * live}") as refused:
            await past.get_items()
        assert refused.value.field == "limit"
        with pytest.raises(MalformedRequest, match="limit"):
            await past.get_items(limit=2 * live + 1)  # one item past the live turns
        assert reads[long] == 0  # refused before any read
        last = await past.get_items(limit=2 * live)  # the live turns' items: no read of the log
        assert [i["content"] for i in last] == [
            f"{k}{n}" for n in range(most + 1 - live, most + 1) for k in "qa"
        ]
        assert reads[long] == 0
        assert memory.log.last_seq(long) == seq  # nothing stored

    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as remote:
        asyncio.run(scenario(remote))


# agents_start with cross-session injection ------------------------------------------------------------


def test_a_start_with_injection_loads_at_most_max_injection_sources_sessions(
    served: tuple[int, MemorySystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user holding many sessions: each new session's start loads at most MAX_INJECTION_SOURCES of
    the others, not every one, so N starts cost at most N times the bound; those it loads are the
    ones written most recently (here the first in key order: the last in key order were before)."""
    monkeypatch.setattr(views, "MAX_INJECTION_SOURCES", 3)
    port, memory = served
    loads: list[MemoryKey] = []
    load = memory.load

    def counted(key: MemoryKey, *args: Any, **kwargs: Any) -> Any:
        loads.append(key)
        return load(key, *args, **kwargs)

    async def scenario(remote: RemoteMemory) -> None:
        for n in reversed(range(8)):  # old-7 first, old-0 last
            remote.session(MemoryKey("acme", "ada", f"old-{n}")).add_turn(_turn(f"turn {n}"))
        monkeypatch.setattr(memory, "load", counted)
        for n in range(3):
            session = ConvmemSession(f"new-{n}", remote, tenant_id="acme", user_id="ada")
            await session.add_items(_pair(n))  # the first write starts it: agents_start
            assert len(loads) <= 3 * (n + 1)
        assert loads[:3] == [MemoryKey("acme", "ada", f"old-{n}") for n in (0, 1, 2)]  # newest first
        assert loads[3:6] == [MemoryKey("acme", "ada", "new-0"), *loads[:2]]  # then new-0 is the newest

    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as remote:
        asyncio.run(scenario(remote))


def test_a_log_without_newest_keys_finds_the_sessions_written_most_recently_from_its_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The in-memory log (as any log without `newest_keys`) gives the user's events in log order: the
    sessions a start loads are still those written most recently, not the last in key order."""
    monkeypatch.setattr(views, "MAX_INJECTION_SOURCES", 2)
    with convmem.connect("memory://", config=CONFIG) as memory:
        assert not hasattr(memory.log, "newest_keys")
        for n in (3, 0, 2, 1):  # old-1 written last, then old-2
            memory.session(MemoryKey("acme", "ada", f"old-{n}")).add_turn(_turn(f"turn {n}"))
        memory.session(MemoryKey("acme", "ada", "old-2")).add_turn(_turn("again"))
        loads: list[MemoryKey] = []
        load = memory.load

        def counted(key: MemoryKey, *args: Any, **kwargs: Any) -> Any:
            loads.append(key)
            return load(key, *args, **kwargs)

        monkeypatch.setattr(memory, "load", counted)
        views.start_session(memory, MemoryKey("acme", "ada", "new"), timeout=WAIT)
        assert loads == [MemoryKey("acme", "ada", "old-2"), MemoryKey("acme", "ada", "old-1")]
