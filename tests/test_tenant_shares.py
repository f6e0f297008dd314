"""Shared per-process resources a hostile tenant could take from the others, on the shipped tenants
configuration (a real nats-server) with only the tenant's own credentials.

The live set (`max_live_sessions`) and the idle cache (`idle_cache_bytes`) of
a service worker are shared by every tenant it serves. Past either bound the
session given up is the least recently used of the tenant holding the most
(live sessions, cached bytes), so a tenant that touches many sessions evicts
its own while another tenant's few stay: that tenant's next writes start no
actor and read no log. Counted with the system's activation and cache-miss
counters, not timed.

The summarizer pool is shared too: its workers take turns between tenants
(the next call is the oldest job of the tenant served least recently), and a
full queue takes a job of a tenant holding fewer jobs in place of the newest
queued job of the tenant holding the most. Seen in the order of the calls
and in the health each session stores.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import pytest
from pool_helpers import Replies, request
from runtime_helpers import WAIT, summarizing_config, wait_until
from test_service import _user, tenants_server  # noqa: F401 (the fixture: the shipped file on a real server)

import convmem
from convmem.actors import MemorySystem, SummarizerPool
from convmem.actors._fair import Heaviest
from convmem.actors._idle import IdleCache, idle_bytes, measure
from convmem.actors._session import StateCell
from convmem.adapters import MemoryService, RemoteMemory, RemoteSession
from convmem.adapters.frontends.service import _operations as operations
from convmem.adapters.frontends.service._errors import MalformedRequest
from convmem.adapters.frontends.service._quotas import Quotas, TenantLimits
from convmem.adapters.frontends.service._shares import ALONE_AFTER, OPERATOR, FairShares, tenant_token
from convmem.errors import QuotaExceeded
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, ShortTermMemoryConfig, encode_token
from convmem.projections import SessionState

CONFIG = ShortTermMemoryConfig(strategy="truncation")
VICTIM = MemoryKey("globex", "bob", "chat-9")
LIVE = 8
"""The worker's `max_live_sessions`."""


def _turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


CACHE = 64 * 1024
"""The worker's `idle_cache_bytes`: about 30 sessions of one turn."""


@pytest.fixture
def served(tenants_server: int) -> Iterator[tuple[int, MemorySystem]]:  # noqa: F811
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(store, config=CONFIG, max_live_sessions=LIVE, idle_cache_bytes=CACHE)
    try:
        with MemoryService(memory, _user(tenants_server, "convmem-api")):
            yield tenants_server, memory
    finally:
        memory.close()


def _counts(memory: MemorySystem) -> dict[str, int]:
    counts: dict[str, int] = memory.metrics.snapshot()["counts"]
    return counts


def test_a_tenant_touching_many_sessions_evicts_its_own_not_another_tenants(
    served: tuple[int, MemorySystem],
) -> None:
    """acme writes to ten times the live bound of sessions between each of globex's writes; globex's
    session stays live throughout, and its writes start no actor and read no log."""
    port, memory = served
    with (
        RemoteSession(_user(port, "globex"), VICTIM, timeout=WAIT) as victim,
        RemoteMemory(_user(port, "acme"), timeout=WAIT) as attacker,
    ):
        victim.add_turn(_turn("globex first"))
        assert memory.is_live(VICTIM)
        flood = 10 * LIVE
        for round_ in range(3):
            before = _counts(memory)
            for n in range(flood):
                attacker.session(MemoryKey("acme", "mallory", f"s{round_}-{n}")).add_turn(_turn(f"flood {n}"))
            assert memory.is_live(VICTIM), f"round {round_}: acme's flood evicted globex's live session"
            middle = _counts(memory)
            assert middle["activations"] - before.get("activations", 0) == flood  # acme's own, each once
            victim.add_turn(_turn(f"globex {round_}"))
            after = _counts(memory)
            assert after["activations"] == middle["activations"], "globex's write paid an activation"
            assert after.get("idle_cache_misses", 0) == middle.get("idle_cache_misses", 0)
        assert memory.live_sessions() == LIVE
        assert [t["user_message"] for t in victim.to_dict()["turns"]] == [
            "globex first",
            "globex 0",
            "globex 1",
            "globex 2",
        ]


def test_a_tenant_filling_the_idle_cache_evicts_its_own_cells_not_another_tenants(
    served: tuple[int, MemorySystem],
) -> None:
    """globex has more sessions than the live bound (some cached without an actor); acme then writes
    to many more than the cache holds. Every globex session is still live or cached, and writing to
    each of them again reads no log (no idle-cache miss)."""
    port, memory = served
    theirs = [MemoryKey("globex", "bob", f"chat-{n}") for n in range(LIVE + LIVE // 2)]
    with (
        RemoteMemory(_user(port, "globex"), timeout=WAIT) as victim,
        RemoteMemory(_user(port, "acme"), timeout=WAIT) as attacker,
    ):
        for key in theirs:
            victim.session(key).add_turn(_turn(f"{key.session_id} first"))
        flood = 100
        for n in range(flood):
            attacker.session(MemoryKey("acme", "mallory", f"s{n}")).add_turn(_turn(f"flood {n}"))
        cached, held = memory.cached_sessions()
        assert cached < len(theirs) + flood - LIVE
        assert held <= CACHE
        lost = [k for k in theirs if not (memory.is_live(k) or memory.is_cached(k))]
        assert lost == [], f"acme's flood pushed globex's sessions out of the worker: {lost}"
        before = _counts(memory)
        for key in theirs:
            victim.session(key).add_turn(_turn(f"{key.session_id} again"))
        after = _counts(memory)
        assert after.get("idle_cache_misses", 0) == before.get("idle_cache_misses", 0), (
            "a globex write read its session from the log"
        )
        for key in theirs:
            turns = victim.session(key).to_dict()["turns"]
            assert [t["user_message"] for t in turns] == [
                f"{key.session_id} first",
                f"{key.session_id} again",
            ]


def _key(tenant: str, n: int) -> MemoryKey:
    return MemoryKey(tenant, "u", f"s{n}")


def test_the_idle_cache_gives_up_the_heaviest_tenants_oldest_cell_first() -> None:
    """Past the bound the cache evicts the least recently used cell of the tenant holding the most
    bytes; one tenant alone is plain least recently used."""
    one = idle_bytes(StateCell(SessionState(config=CONFIG), 0.0))
    cache = IdleCache(10 * one)
    cells = {}
    for key in [_key("small", 0), *(_key("big", n) for n in range(40))]:
        cells[key] = StateCell(SessionState(config=CONFIG), 0.0)
        cache.put(key, cells[key], measure(cells[key]))
    assert _key("small", 0) in cache  # the oldest of all, kept: "big" holds more
    assert cache.bytes <= cache.max_bytes
    assert cache.tenant_bytes("small") + cache.tenant_bytes("big") == cache.bytes
    kept = [k for k in cache if k.tenant_id == "big"]
    assert kept == [_key("big", n) for n in range(31, 40)]  # its newest nine
    alone = IdleCache(cache.bytes - cache.tenant_bytes("small"))
    for key in kept:
        alone.put(key, cells[key], measure(cells[key]))
    alone.get(kept[0])  # now the most recently used
    newest = StateCell(SessionState(config=CONFIG), 0.0)
    alone.put(_key("big", 99), newest, measure(newest))
    assert kept[0] in alone
    assert kept[1] not in alone
    for key in list(cache):
        cache.pop(key)
    assert cache.bytes == 0
    assert cache.tenant_bytes("big") == cache.tenant_bytes("small") == 0


class _Gated:
    """A summarizer whose first call waits for `release`; records whose turns each call summarized."""

    def __init__(self) -> None:
        self.tenants: list[str] = []
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        with self._lock:
            self.tenants.append(request["turns"][0]["user"].split()[0])
            first = len(self.tenants) == 1
        if first:
            self.gate.wait(WAIT * 4)
        return {"summary": "summarized"}

    def calls(self) -> list[str]:
        with self._lock:
            return list(self.tenants)


QUEUE = 6
"""The worker's `summarizer_queue`: jobs asked and not answered, the running one included."""


def test_a_tenant_filling_the_summarizer_queue_neither_refuses_nor_delays_another_tenants_summary(
    tenants_server: int,  # noqa: F811
) -> None:
    """acme's twelve sessions each ask for a summary while the one worker's first call is held:
    six fill the queue, six are refused (acme's own sessions go RETRY). globex's summary then takes
    the place of acme's newest queued one (one more acme session RETRY, globex's stays HEALTHY) and is
    the next call made, not the sixth."""
    summarizer = _Gated()
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(
        store,
        config=summarizing_config(),
        summarizer=summarizer,
        summarizer_workers=1,
        summarizer_queue=QUEUE,
    )
    theirs = [MemoryKey("acme", "mallory", f"s{n}") for n in range(2 * QUEUE)]

    def retrying() -> list[MemoryKey]:
        return [k for k in theirs if memory.session(k).snapshot_state().health is MemoryHealth.RETRY]

    try:
        with (
            MemoryService(memory, _user(tenants_server, "convmem-api")),
            RemoteMemory(_user(tenants_server, "acme"), timeout=WAIT) as attacker,
            RemoteSession(_user(tenants_server, "globex"), VICTIM, timeout=WAIT) as victim,
        ):
            for key in theirs:
                for n in range(3):
                    attacker.session(key).add_turn(_turn(f"acme {key.session_id} {n}"))
            pool = memory._services.pool
            assert pool is not None
            wait_until(lambda: pool.queued == QUEUE and len(retrying()) == QUEUE, message="acme's queue")
            for n in range(3):
                victim.add_turn(_turn(f"globex {n}"))
            mine = memory.session(VICTIM)
            wait_until(
                lambda: len(retrying()) > QUEUE or mine.snapshot_state().health is MemoryHealth.RETRY,
                message="globex's summary asked",
            )
            assert mine.snapshot_state().health is MemoryHealth.HEALTHY, "globex's summary was refused"
            assert len(retrying()) == QUEUE + 1  # acme's newest queued job gave its place up
            assert pool.queued == QUEUE
            summarizer.gate.set()
            wait_until(lambda: len(summarizer.calls()) >= 2, message="the next call")
            assert summarizer.calls()[:2] == ["acme", "globex"], "globex's summary waited behind acme's"
            victim.flush()
            assert mine.snapshot_state().summary == "summarized"
            assert mine.snapshot_state().health is MemoryHealth.HEALTHY
    finally:
        memory.close()


def test_the_pools_worker_takes_turns_between_tenants_and_runs_every_job_once() -> None:
    """While a's first call is held, a queues three more jobs, b two, c one: the worker then takes
    them in turns (b, c, a, b, a, a), every job called and answered once; a full queue takes c's job
    in place of a's newest queued one, and refuses a's own."""
    summarizer = _Gated()
    pool = SummarizerPool(summarizer, workers=1, queue_limit=7, call_timeout=WAIT * 8)
    replies = Replies()
    order = ["a", "a", "a", "a", "b", "b", "c"]
    try:
        for n, tenant in enumerate(order):
            job = request(n)
            job = msgspec.structs.replace(
                job,
                key=MemoryKey(tenant, "u", f"s{n}"),
                turns=(msgspec.structs.replace(job.turns[0], user_message=f"{tenant} {n}"),),
            )
            assert pool.submit(job, replies)
            if n == 0:
                wait_until(lambda: summarizer.calls() == ["a"], message="a's first call")
        assert pool.queued == 7
        late = msgspec.structs.replace(request(7), key=MemoryKey("a", "u", "s7"))
        assert not pool.submit(late, replies)  # a holds the most: its own job waits no place
        extra = msgspec.structs.replace(
            request(8),
            key=MemoryKey("c", "u", "s8"),
            turns=(msgspec.structs.replace(request(8).turns[0], user_message="c 8"),),
        )
        assert pool.submit(extra, replies)  # c holds one, a four: a's newest queued job gives way
        pushed = replies.wait(1)[0]
        assert (pushed.request.covers_from, pushed.error) == (3, "summarizer queue is full")
        summarizer.gate.set()
        outcomes = replies.wait(8)
        assert summarizer.calls() == ["a", "b", "c", "a", "b", "c", "a"]
        assert sorted(o.request.covers_from for o in outcomes) == [0, 1, 2, 3, 4, 5, 6, 8]
        assert [o.summary for o in outcomes[1:]] == ["summarized"] * 7
        assert pool.queued == 0
    finally:
        pool.close()


FORKS = 8
"""Forks acme asks for at once: the default `max_running`, so all run together."""


def test_forks_asked_at_once_never_take_a_tenant_past_its_byte_quota(tenants_server: int) -> None:  # noqa: F811
    """A fork stores a copy of a whole session from a request of a few bytes. acme holds a session
    of about a third of its quota and asks for eight forks of it at once: at most as many as fit
    below the quota are made (each counted with the bytes it will store, one fork at a time), the
    rest are refused with QuotaExceeded, so acme's stored bytes stay below its quota."""
    quota = 60_000
    quotas = Quotas(tenants={"acme": TenantLimits(max_bytes=quota)})
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(store, config=CONFIG)
    source = MemoryKey("acme", "mallory", "big")
    try:
        with (
            MemoryService(memory, _user(tenants_server, "convmem-api"), quotas=quotas),
            RemoteMemory(_user(tenants_server, "acme"), timeout=WAIT) as attacker,
        ):
            session = attacker.session(source)
            while memory.log.stored_bytes("acme")[0] < quota // 3:  # type: ignore[attr-defined]
                session.add_turn(_turn("x" * 1000))
            done: list[object] = []

            def fork(n: int) -> None:
                try:
                    done.append(attacker.session(source).fork(f"copy-{n}"))
                except QuotaExceeded as exc:
                    done.append(exc)

            threads = [threading.Thread(target=fork, args=(n,)) for n in range(FORKS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT * 4)
            made = [d for d in done if isinstance(d, dict)]
            refused = [d for d in done if isinstance(d, QuotaExceeded)]
            assert len(made) + len(refused) == FORKS
            stored = memory.log.stored_bytes("acme")[0]  # type: ignore[attr-defined]
            assert stored < quota, f"{len(made)} forks took acme to {stored:,} bytes, over its {quota:,}"
            assert len(made) == 1  # a third, plus one copy; a second copy would pass the quota
            assert all(r.limit == "max_bytes" and "the fork asked for would store" in str(r) for r in refused)
    finally:
        memory.close()


def test_the_heaviest_tenant_is_found_without_looking_at_the_others() -> None:
    """Among ten thousand tenants the heaviest is picked at the first look (one call of `pick`),
    whatever the order weights changed in; stale weights are skipped, ties go to the tenant that
    came to its weight first, and the heap stays within twice the tenants."""
    held = Heaviest()
    for n in range(10_000):
        held.add(f"t{n}", 1)
    held.add("t5000", 4)
    held.add("t17", 9)
    held.add("t17", -9)  # back to 1: its entry of 10 is stale
    looked: list[str] = []

    def pick(tenant: str) -> str:
        looked.append(tenant)
        return tenant

    assert held.first(pick) == "t5000"
    assert looked == ["t5000"]
    held.add("t5000", -4)  # every tenant at 1 now: the first to get there
    looked.clear()
    assert held.first(pick) == "t0"
    assert looked == ["t0"]
    looked.clear()
    assert held.first(lambda t: pick(t) if t == "t2" else (looked.append(t), None)[1]) == "t2"
    assert looked == ["t0", "t1", "t2"]  # refused tenants are looked at in turn, then kept
    assert held.first(pick) == "t0"
    for n in range(10_000):
        held.add(f"t{n}", -1)
    assert held.weights == {}
    assert len(held._heap) <= 64


def test_one_sessions_request_reads_at_most_max_listed_sessions(
    served: tuple[int, MemorySystem], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each session a ``sessions`` request lists is read and folded on the server every tenant shares;
    a tenant holding more than MAX_LISTED sessions gets MalformedRequest naming the limit for a
    request without one (or with a larger one), and the first ones in key order with a limit."""
    monkeypatch.setattr(operations, "MAX_LISTED", 5)
    port, _ = served
    with RemoteMemory(_user(port, "acme"), timeout=WAIT) as attacker:
        for n in range(7):
            attacker.session(MemoryKey("acme", "mallory", f"s{n}")).add_turn(_turn(f"acme {n}"))
        attacker.session(MemoryKey("acme", "alice", "one")).add_turn(_turn("acme alice"))
        with pytest.raises(MalformedRequest, match=r"tenant 'acme' has more than 5 sessions") as refused:
            attacker.sessions("acme")
        assert refused.value.field == "limit"
        with pytest.raises(MalformedRequest, match=r"from 1 to 5 .* got 6"):
            attacker.sessions("acme", limit=6)
        listed = attacker.sessions("acme", limit=5)
        assert [row["session_id"] for row in listed] == ["one", "s0", "s1", "s2", "s3"]
        assert [row["session_id"] for row in attacker.sessions("acme", "alice")] == ["one"]
        with pytest.raises(MalformedRequest, match=r"user 'mallory' of tenant 'acme' has more than 5"):
            attacker.sessions("acme", "mallory")


def test_a_tenants_cpu_estimate_bounds_how_many_of_its_requests_run_at_once() -> None:
    """FairShares weighs requests by their CPU: a tenant whose requests cost 10 ms runs one at a
    time (another tenant's start at once beside it), a cheap request between expensive ones does not
    hide them, and a tenant whose requests turned cheap gets its max_running back as the estimate
    decays."""
    shares = FairShares(Quotas(), 64, clock=lambda: 0.0)  # every request at once: nobody is alone
    started: list[str] = []
    for token in ("acme",) * 8 + ("globex",) * 2:
        assert shares.admit(token, lambda token=token: started.append(token))
    assert started.count("acme") == 8  # nothing measured yet: its max_running
    for _ in range(8):
        shares.measured("acme", 0.010)
        shares.done("acme")
    for _ in range(8):
        shares.admit("acme", lambda: started.append("acme"))
    assert shares.of("acme") == (8, 1)  # 10 ms a request: one at a time
    assert shares.of("globex") == (2, 2)  # never waits behind it
    shares.measured("acme", 0.0001)  # a cheap one between: the estimate stays near 10 ms
    shares.done("acme")
    assert shares.of("acme") == (7, 1)
    assert shares.allowed("acme", TenantLimits()) == 1
    for _ in range(7):
        shares.measured("acme", 0.0001)
        shares.done("acme")
    for _ in range(40):  # cheap requests from now on: the estimate decays below CPU_SHARE / 8
        shares.measured("acme", 0.0001)
    assert shares.allowed("acme", TenantLimits()) == TenantLimits().max_running


def test_a_tenants_cpu_expensive_requests_take_one_place_beside_another_tenants(
    tenants_server: int,  # noqa: F811
) -> None:
    """Through the service, with only acme's credentials: acme's reads each cost 20 ms of CPU (a
    stand-in for a long recall query over a long session, burnt on the worker thread). After the
    first is measured, eight sent at once run one at a time, and globex's read starts beside one of
    them, not eight: on one interpreter eight would leave globex a ninth of it (bench.cpu_fairness:
    its p99 rose 12x). Counted in the requests the worker threads ran, not timed."""
    store = f"nats://convmem:convmem-service-secret@127.0.0.1:{tenants_server}"
    memory = convmem.connect(store, config=CONFIG)
    acme = encode_token("acme")
    gate = threading.Event()
    running: list[tuple[str, int]] = []  # (tenant token, acme's requests running) as each read began
    try:
        service = MemoryService(memory, _user(tenants_server, "convmem-api"))
        real = service._ops.answer

        def answer(subject: str, data: bytes) -> Any:
            token = tenant_token(service.api_prefix, subject)
            running.append((token, service._shares.of(acme)[1]))
            if token == acme:
                began = time.thread_time()
                while time.thread_time() - began < 0.02:  # CPU, not a wait: what the estimate sees
                    pass
                if sum(t == acme for t, _ in running) > 1:
                    gate.wait(WAIT)  # held until globex's read began (acme's first read is the warm-up)
            return real(subject, data)

        service._ops.answer = answer  # type: ignore[method-assign]
        service._shares._clock = lambda: 0.0  # every request at once: globex is never long gone
        with (
            service,
            RemoteMemory(_user(tenants_server, "acme"), timeout=WAIT) as attacker,
            RemoteMemory(_user(tenants_server, "globex"), timeout=WAIT) as victim,
        ):
            victim.session(VICTIM).get_llm_context(query="invoice")  # globex is a tenant of this worker
            attacker.session(MemoryKey("acme", "mallory", "s0")).get_llm_context(query="invoice")
            warmed = len(running)
            replies: list[object] = []
            threads = [
                threading.Thread(
                    target=lambda n=n: replies.append(
                        attacker.session(MemoryKey("acme", "mallory", f"s{n}")).get_llm_context(
                            query="invoice"
                        )
                    )
                )
                for n in range(8)
            ]
            for thread in threads:
                thread.start()
            assert service.wait_for(lambda: service._shares.of(acme)[0] == 8, WAIT)
            victim.session(VICTIM).get_llm_context(query="invoice")
            gate.set()
            for thread in threads:
                thread.join(WAIT)
            assert len(replies) == 8
            globex = [count for token, count in running[warmed:] if token == encode_token("globex")]
            assert globex == [1], f"globex's read began beside {globex} of acme's"
            assert max(count for token, count in running[warmed:] if token == acme) == 1
    finally:
        memory.close()


def test_a_tenant_alone_keeps_its_concurrency_whatever_its_requests_cost() -> None:
    """The CPU weighing shares the interpreter between tenants; a tenant alone (no other tenant's
    request for ALONE_AFTER seconds, operator requests aside) runs up to its max_running, and is
    weighed again as soon as another tenant asks."""
    now = [0.0]
    shares = FairShares(Quotas(), 64, clock=lambda: now[0])
    started: list[str] = []
    shares.admit("globex", lambda: started.append("globex"))
    shares.done("globex")
    shares.admit(OPERATOR, lambda: started.append(OPERATOR))
    shares.done(OPERATOR)
    shares.measured("acme", 0.010)
    now[0] = ALONE_AFTER + 1.0  # globex's last request is long past; the operator's does not count
    for _ in range(8):
        shares.admit("acme", lambda: started.append("acme"))
    assert shares.of("acme") == (8, 8)
    for _ in range(8):
        shares.measured("acme", 0.010)
        shares.done("acme")
    shares.admit("globex", lambda: started.append("globex"))  # globex is back
    for _ in range(8):
        shares.admit("acme", lambda: started.append("acme"))
    assert shares.of("acme") == (8, 1)
