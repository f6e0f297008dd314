"""Fair shares and quotas per tenant: `Busy` past a tenant's requests in flight, `QuotaExceeded` past its
stored bytes, other tenants served meanwhile; on a real nats-server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, TypeVar

import pytest
from runtime_helpers import WAIT, PlannedSummarizer, summarizing_config, turn, wait_until

import convmem
from convmem.actors import ErasureNotice, MemorySystem
from convmem.adapters import (
    AsyncRemoteSession,
    EmbeddedNatsServer,
    MemoryService,
    Quotas,
    RemoteMemory,
    TenantLimits,
)
from convmem.adapters.backends.jetstream._usage import usage_bucket
from convmem.adapters.frontends.cli._common import CliError
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._serve import load_quotas
from convmem.adapters.frontends.service._shares import FairShares
from convmem.adapters.frontends.service._usage import (
    TenantUsage,
    appended_of,
    bound_of,
    counter_of,
    tallies_of,
)
from convmem.errors import Busy, InvalidConfig, QuotaExceeded, StoreFull, TenantLimitReached
from convmem.events import MemoryKey

E = TypeVar("E", bound=Exception)


@pytest.fixture
def api_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}.api"


@pytest.fixture
def url(nats_server_shared: EmbeddedNatsServer) -> str:
    return nats_server_shared.url


def _system(url: str, names: Any, **options: Any) -> MemorySystem:
    return convmem.connect(
        url, stream=names.stream, prefix=names.prefix, bucket=names.bucket, snapshot_every=1, **options
    )


# Fair shares -------------------------------------------------------------------------------


def test_tenants_take_turns_at_the_free_places_and_wait_behind_their_own_requests() -> None:
    """With one place, a tenant's queued requests alternate with another tenant's, oldest first."""
    shares = FairShares(Quotas(default=TenantLimits(max_in_flight=10, max_running=1)), capacity=1)
    started: list[str] = []
    for n in range(4):
        shares.admit("flood", lambda n=n: started.append(f"flood{n}"))
    for n in range(2):
        shares.admit("calm", lambda n=n: started.append(f"calm{n}"))
    assert started == ["flood0"]
    while shares.running:
        token = started[-1].rstrip("0123456789")
        shares.done(token)
    # flood was in line before calm came: from there on they alternate
    assert started == ["flood0", "flood1", "calm0", "flood2", "calm1", "flood3"]
    assert shares.in_flight == 0


def test_a_tenant_never_runs_more_than_its_share_while_places_are_free() -> None:
    """A tenant at max_running waits for its own requests even with places free; Busy past max_in_flight."""
    shares = FairShares(Quotas(default=TenantLimits(max_in_flight=3, max_running=2)), capacity=8)
    started: list[int] = []
    for n in range(3):
        shares.admit("acme", lambda n=n: started.append(n))
    assert started == [0, 1]
    assert shares.of("acme") == (3, 2)
    assert not shares.admit("acme", lambda: started.append(99))  # refused: nothing queued
    refused = shares.busy("acme")
    assert (refused.limit, refused.allowed, refused.usage) == ("max_in_flight", 3, 3)
    assert refused.tenant_id == "acme"
    assert shares.admit("globex", lambda: started.append(10))  # another tenant starts at once
    assert started == [0, 1, 10]
    shares.done("acme")
    assert started == [0, 1, 10, 2]


# Busy ----------------------------------------------------------------------------------------


def test_a_flooding_tenant_gets_busy_while_another_tenants_writes_all_succeed(
    url: str, api_prefix: str, jetstream_names: Any
) -> None:
    """acme's requests held at its bound: the rest are Busy at once; globex's writes all succeed meanwhile."""
    summarizer = PlannedSummarizer(default="hang")  # acme's flushes wait on it: requests held in flight
    system = _system(url, jetstream_names, config=summarizing_config(), summarizer=summarizer)
    quotas = Quotas(default=TenantLimits(max_in_flight=6, max_running=2))
    acme, globex = MemoryKey("acme", "u", "held"), MemoryKey("globex", "v", "calm")
    try:
        with MemoryService(system, url, api_prefix=api_prefix, max_concurrency=4, quotas=quotas) as service:

            async def scenario() -> tuple[list[Any], list[int]]:
                async with (
                    AsyncRemoteSession(url, acme, api_prefix=api_prefix, timeout=WAIT * 2) as flood,
                    AsyncRemoteSession(url, globex, api_prefix=api_prefix, timeout=WAIT) as calm,
                ):
                    for n in range(3):
                        await flood.add_turn(turn(f"a{n}"))
                    await asyncio.to_thread(summarizer.wait_calls, 1)
                    tasks = [asyncio.ensure_future(flood.flush()) for _ in range(16)]
                    async with asyncio.timeout(WAIT):
                        while sum(t.done() for t in tasks) < 10:  # the refused answer at once
                            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    written = [await calm.add_turn(turn(f"g{n}")) for n in range(5)]
                    assert sum(t.done() for t in tasks) == 10  # acme's six are still held
                    summarizer.release()
                    return list(await asyncio.gather(*tasks, return_exceptions=True)), written

            outcomes, written = asyncio.run(scenario())
            refused = [o for o in outcomes if isinstance(o, Busy)]
            assert len(refused) == 10
            assert outcomes.count(None) == 6
            assert all(isinstance(o, TenantLimitReached) for o in refused)
            assert {(b.tenant_id, b.limit, b.allowed, b.usage) for b in refused} == {
                ("acme", "max_in_flight", 6, 6)
            }
            assert "max_in_flight" in str(refused[0])
            assert written == [1, 2, 3, 4, 5]
            assert service.metrics()["service"]["errors_by_type"].get("Busy") == 10
    finally:
        summarizer.release()
        system.close()


# Stored bytes ----------------------------------------------------------------------------------


def _write_until_refused(session: Any, label: str, refusal: type[E], most: int = 200) -> E:
    """Write turns of 200-odd bytes until one is refused with `refusal` (at most `most`)."""
    for n in range(most):
        try:
            session.add_turn(turn(f"{label}{n} " + "x" * 200))
        except refusal as exc:
            return exc
    raise AssertionError(f"no {refusal.__name__} after {most} writes")


def test_a_tenant_over_its_byte_quota_gets_quota_exceeded_and_others_still_write(
    url: str, api_prefix: str, jetstream_names: Any
) -> None:
    """Past max_bytes acme's writes are refused, its reads work; globex writes; erasing makes room;
    a new service on the same log knows acme's bytes from its first write."""
    quota = 6_000
    quotas = Quotas(tenants={"acme": TenantLimits(max_bytes=quota)})
    acme, globex = MemoryKey("acme", "u", "big"), MemoryKey("globex", "v", "small")
    system = _system(url, jetstream_names)
    try:
        with (
            MemoryService(system, url, api_prefix=api_prefix, quotas=quotas),
            RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as remote,
        ):
            session = remote.session(acme)
            refused = _write_until_refused(session, "a", QuotaExceeded)
            assert (refused.tenant_id, refused.limit, refused.allowed) == ("acme", "max_bytes", quota)
            assert refused.usage >= quota
            assert f"{quota:,}" in str(refused)
            stored = system.log.stored_bytes("acme")[0]  # type: ignore[attr-defined]
            assert stored >= quota  # refused on the log's count, not on a guess
            assert session.to_dict()["turns"]  # reads still work
            assert [remote.session(globex).add_turn(turn(f"g{n}")) for n in range(3)] == [1, 2, 3]
        with (
            MemoryService(system, url, api_prefix=api_prefix, quotas=quotas),
            RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as remote,
        ):
            with pytest.raises(QuotaExceeded):  # counted from the stream: a restart forgets nothing
                remote.session(acme).add_turn(turn("after restart"))
            remote.session(acme).erase()  # erasure still works, and makes room
            assert remote.session(acme).add_turn(turn("after erasure")) == 1
    finally:
        system.close()


def test_the_byte_count_is_what_jetstream_counts(url: str, jetstream_names: Any) -> None:
    """A tenant's count equals the stream's bytes (its only tenant); counted from a position, the rest."""
    system = _system(url, jetstream_names)
    try:
        for n in range(4):
            system.session(MemoryKey("acme", "u", f"s{n % 2}")).add_turn(turn(f"t{n}"))
        log: Any = system.log
        total, position = log.stored_bytes("acme")
        for n in range(3):
            system.session(MemoryKey("acme", "u", "s2")).add_turn(turn(f"more{n}"))
        more, last = log.stored_bytes("acme", after_position=position)
        info = log._conn.call(lambda: log._conn.api(f"$JS.API.STREAM.INFO.{log.stream}"), what="info")
        assert total + more == info["state"]["bytes"]
        assert last == info["state"]["last_seq"]
        assert more > 0
        assert log.stored_bytes("globex") == (0, 0)
        assert log.all_stored_bytes() == info["state"]["bytes"]  # the bound a first write may pass on
        system.session(MemoryKey("globex", "u", "s")).add_turn(turn("other"))
        assert log.all_stored_bytes() > total + more  # every tenant's: never below one tenant's count
    finally:
        system.close()


# Configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"default": {"max_in_flight": 0}}, "quotas.default.max_in_flight"),
        ({"default": {"max_in_flight": "many"}}, "quotas.default.max_in_flight"),
        ({"default": {"max_running": 9, "max_in_flight": 4}}, "quotas.default.max_running"),
        ({"default": {"max_bytes": True}}, "quotas.default.max_bytes"),
        ({"default": {"max_bytes": 2**70}}, "quotas.default.max_bytes"),
        ({"default": {"max_bytes": -5}}, "quotas.default.max_bytes"),
        ({"default": {"max_bytes": "12 parsecs"}}, "quotas.default.max_bytes"),
        ({"default": []}, "quotas.default"),
        ({"tenants": {"acme": {"max_bytes": "lots"}}}, "quotas.tenants.acme.max_bytes"),
        ({"tenants": {"acme": {"max_byte": 1}}}, "quotas.tenants.acme.max_byte"),
        ({"tenants": {"": {}}}, "quotas.tenants."),
        ({"tenants": {"a\x00b": {}}}, "quotas.tenants.a\x00b"),
        ({"tenants": ["acme"]}, "quotas.tenants"),
        ({"recount_every": "soon"}, "quotas.recount_every"),
        ({"recount_every": 0}, "quotas.recount_every"),
        ({"max_bytes": 5}, "quotas.max_bytes"),
        ("all of it", "quotas"),
    ],
)
def test_a_bad_quotas_table_is_refused_naming_the_key(table: object, key: str) -> None:
    """Every hostile or mistyped quotas setting is an InvalidConfig naming its key, never a traceback."""
    with pytest.raises(InvalidConfig) as refused:
        Quotas.from_mapping(table)
    assert refused.value.field == key


def test_the_serve_configuration_file_sets_each_tenants_limits(tmp_path: Path) -> None:
    """A tenant's table inherits what it does not give from [quotas.default]; sizes take units."""
    path = tmp_path / "convmem.toml"
    path.write_text(
        'strategy = "truncation"\n'
        '[quotas.default]\nmax_in_flight = 20\nmax_bytes = "1MiB"\n'
        '[quotas.tenants.acme]\nmax_bytes = "unlimited"\n'
        '[quotas.tenants."globex corp"]\nmax_running = 3\n',
        encoding="utf-8",
    )
    quotas = load_quotas(path)
    assert quotas.default == TenantLimits(max_in_flight=20, max_running=8, max_bytes=1 << 20)
    assert quotas.tenants["acme"] == TenantLimits(max_in_flight=20, max_running=8, max_bytes=None)
    assert quotas.tenants["globex corp"] == TenantLimits(max_in_flight=20, max_running=3, max_bytes=1 << 20)
    assert quotas.of_token("globex=20corp").max_running == 3
    assert load_quotas(None) == Quotas()


def test_a_bad_quota_in_the_serve_configuration_file_names_the_file_and_key(tmp_path: Path) -> None:
    """`convmem serve --config` with a bad quota stops with an error naming the file and the key."""
    path = tmp_path / "convmem.toml"
    path.write_text('[quotas.tenants.acme]\nmax_bytes = "a lot"\n', encoding="utf-8")
    with pytest.raises(CliError) as refused:
        load_quotas(path)
    assert str(path) in str(refused.value)
    assert "quotas.tenants.acme.max_bytes" in str(refused.value)


def test_a_service_refuses_quotas_of_the_wrong_kind(url: str, jetstream_names: Any) -> None:
    """MemoryService(quotas=...) takes a Quotas only."""
    system = _system(url, jetstream_names)
    try:
        with pytest.raises(InvalidConfig) as refused:
            MemoryService(system, url, quotas={"default": {}})  # type: ignore[arg-type]
        assert refused.value.field == "quotas"
    finally:
        system.close()


# The tally -------------------------------------------------------------------------------------


class _Log:
    """Stored sizes by position, as the counter sees the stream (a list the test appends to)."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.last = 0
        self.counts: list[int] = []  # the position each count started after

    def append(self, size: int) -> None:
        self.last += 1
        self.sizes[self.last] = size

    def erase_all(self) -> None:
        self.sizes.clear()

    async def count(self, _tenant: str, after: int) -> tuple[int, int]:
        self.counts.append(after)
        past = {p: s for p, s in self.sizes.items() if p > after}
        return sum(past.values()), max(past, default=after)


def _counting_usage(
    system: MemorySystem, now: list[float], counts: list[int], *, bound: bool = True
) -> TenantUsage:
    """A service instance's `TenantUsage` on `system`'s JetStream log (as `usage_of` makes it), its
    full counts noted in `counts` and its clock `now[0]`."""
    log = system.log
    counter = counter_of(log, asyncio.to_thread)

    async def counted(tenant_id: str, after: int) -> tuple[int, int]:
        counts.append(after)
        return await counter(tenant_id, after)

    return TenantUsage(
        counted,
        bound=bound_of(log, asyncio.to_thread) if bound else None,
        tallies=tallies_of(log, asyncio.to_thread),
        appended=appended_of(log),
        recount_every=5.0,
        clock=lambda: now[0],
    )


def _stored(system: MemorySystem, tenant_id: str) -> int:
    log: Any = system.log
    return int(log.stored_bytes(tenant_id)[0])


def test_what_the_log_sends_is_counted_as_the_stream_stores_it(url: str, jetstream_names: Any) -> None:
    """The bytes a log sends for a tenant's appends (first writes, later ones, several events at once)
    are what the stream counts for them, as they go out: no message is read back for it."""
    system = _system(url, jetstream_names)
    try:
        for n in range(5):
            system.session(MemoryKey("acme", "u", f"s{n % 2}")).add_turn(turn(f"t{n}" * (n + 1)))
        system.session(MemoryKey("acme", "u", "s0")).pop_item()
        system.fork(MemoryKey("acme", "u", "s1"), to=MemoryKey("acme", "u", "f"))  # events in one batch
        log: Any = system.log
        info = log._conn.call(lambda: log._conn.api(f"$JS.API.STREAM.INFO.{log.stream}"), what="info")
        assert log.appended_bytes("acme") == info["state"]["bytes"] == _stored(system, "acme")
        assert log.appended_bytes("globex") == 0
    finally:
        system.close()


def test_a_fresh_instance_is_admitted_on_the_shared_tally_without_counting(
    url: str, jetstream_names: Any
) -> None:
    """The first instance counts the tenant in full once (the stream holds more than its quota, so
    its bytes in all cannot admit it) and keeps the shared tally with what it writes; a fresh
    instance (a restart, a new worker) reads that tally and admits the tenant's first write with no
    count, and the tally is the tenant's stored bytes."""
    system = _system(url, jetstream_names)
    try:
        for n in range(3):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
        for n in range(12):
            system.session(MemoryKey("globex", "u", f"s{n}")).add_turn(turn(f"other {n}" * 20))
        quota = _stored(system, "acme") * 3
        now, first_counts, fresh_counts = [0.0], [], []  # type: ignore[var-annotated]

        async def scenario() -> None:
            first = _counting_usage(system, now, first_counts)
            await asyncio.wait_for(first.check("acme", quota), WAIT)
            assert first_counts == [0]  # counted in full: the stream's total is over the quota
            await asyncio.to_thread(
                lambda: system.session(MemoryKey("acme", "u", "s0")).add_turn(turn("more"))
            )
            now[0] = 5.0
            await asyncio.wait_for(first.check("acme", quota), WAIT)  # an add falls due: in the background
            await asyncio.wait_for(first.close(), WAIT)
            assert first_counts == [0]
            log: Any = system.log
            assert log.usage_tally("acme")[0] == _stored(system, "acme")

            fresh = _counting_usage(system, now, fresh_counts)
            await asyncio.wait_for(fresh.check("acme", quota), WAIT)
            assert fresh_counts == []  # admitted on the shared tally: no count
            assert fresh.usage("acme") == _stored(system, "acme")

            refusing_counts: list[int] = []
            refusing = _counting_usage(system, now, refusing_counts)
            with pytest.raises(QuotaExceeded):  # over by the shared tally: refused on a full count only
                await asyncio.wait_for(refusing.check("acme", _stored(system, "acme")), WAIT)
            assert refusing_counts == [0]

        asyncio.run(scenario())
    finally:
        system.close()


def test_instances_writing_one_tenant_add_to_one_tally(url: str, jetstream_names: Any) -> None:
    """Two instances (each its own connection, as `serve --workers` has) write one tenant; each adds
    its writes to the shared tally on the revision it read, so neither add is lost: the tally is the
    tenant's stored bytes, and each instance sees the other's writes."""
    one, two = _system(url, jetstream_names), _system(url, jetstream_names)
    try:
        one.session(MemoryKey("acme", "u", "a")).add_turn(turn("first"))
        now, counts = [0.0], []  # type: ignore[var-annotated]

        async def scenario() -> None:
            first = _counting_usage(one, now, counts, bound=False)  # the first count awaited
            second = _counting_usage(two, now, counts, bound=False)
            await asyncio.wait_for(first.check("acme", 1 << 30), WAIT)
            await asyncio.wait_for(second.check("acme", 1 << 30), WAIT)
            assert counts == [0]  # the second read the first's tally
            for n in range(3):
                await asyncio.to_thread(
                    lambda n=n: one.session(MemoryKey("acme", "u", "a")).add_turn(turn(f"a{n}"))
                )
                await asyncio.to_thread(
                    lambda n=n: two.session(MemoryKey("acme", "u", "b")).add_turn(turn(f"b{n}"))
                )
            now[0] = 5.0
            await asyncio.wait_for(second.close(), WAIT)  # the second adds first: the first's revision is old
            await asyncio.wait_for(first.close(), WAIT)
            log: Any = one.log
            assert log.usage_tally("acme")[0] == _stored(one, "acme")
            now[0] = 10.0
            await asyncio.wait_for(second.check("acme", 1 << 30), WAIT)
            await asyncio.wait_for(second.close(), WAIT)
            assert second.usage("acme") == _stored(one, "acme") == first.usage("acme")
            assert counts == [0]

        asyncio.run(scenario())
    finally:
        one.close()
        two.close()


def test_a_tenant_refused_on_its_tally_is_counted_in_full_after_an_erasure(
    url: str, jetstream_names: Any
) -> None:
    """A tenant at its quota by the tally is refused (on a full count at most full_every old); once
    some of its sessions are erased, the next write counts it in full again and is admitted, and the
    shared tally drops to what is stored."""
    system = _system(url, jetstream_names)
    try:
        for n in range(4):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}" * 30))
        quota = _stored(system, "acme")
        now, counts = [0.0], []  # type: ignore[var-annotated]

        async def scenario() -> None:
            usage = _counting_usage(system, now, counts, bound=False)
            with pytest.raises(QuotaExceeded):
                await asyncio.wait_for(usage.check("acme", quota), WAIT)
            assert counts == [0]
            now[0] = 6.0
            with pytest.raises(QuotaExceeded):  # the tally is brought up to date, not counted again
                await asyncio.wait_for(usage.check("acme", quota), WAIT)
            assert counts == [0]
            await asyncio.to_thread(lambda: [system.erase(MemoryKey("acme", "u", f"s{n}")) for n in range(3)])
            usage.erased("acme")
            await asyncio.wait_for(usage.check("acme", quota), WAIT)  # counted in full: room again
            assert counts == [0, 0]
            assert usage.usage("acme") == _stored(system, "acme") < quota
            log: Any = system.log
            assert log.usage_tally("acme")[0] == _stored(system, "acme")

        asyncio.run(scenario())
    finally:
        system.close()


def _erasing_usage(system: MemorySystem, now: list[float], counts: list[int]) -> TenantUsage:
    """`_counting_usage` taking what `system`'s log erases off the tallies, as `usage_of` makes it
    (`erased`, and the log's notices told which tenants it tallies)."""
    log: Any = system.log
    counting = _counting_usage(system, now, counts, bound=False)
    usage = TenantUsage(
        counting._counter,
        tallies=counting._shared,
        appended=appended_of(log),
        erased=log.erased_bytes,
        recount_every=5.0,
        clock=lambda: now[0],
    )
    log.tally_erasures(usage.takes_erasures_of)
    return usage


def test_an_erasure_through_an_instance_is_taken_off_every_tally_without_a_count(
    url: str, jetstream_names: Any
) -> None:
    """Two instances refuse a tenant at its quota (a full count each); one erases a session: it takes
    the bytes it deleted off its tally at once and adds that to the shared tally, and its notices say
    so (`tallied`), so the other reads the shared tally instead of counting in full. Both admit the
    tenant again with no count, each tally what is stored. Another instance's add landing while an
    erasure runs may be a count made after its deletes: the erased bytes are counted in full then."""
    one, two = _system(url, jetstream_names), _system(url, jetstream_names)
    notices: list[ErasureNotice] = []
    unwatch = two.log.watch_erasures(lambda notice: notices.append(notice) if notice else None)  # type: ignore[attr-defined]
    try:
        for n in range(4):
            one.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}" * 30))
        quota = _stored(one, "acme")
        now, counts = [0.0], []  # type: ignore[var-annotated]

        async def told(count: int) -> list[ErasureNotice]:
            await asyncio.to_thread(wait_until, lambda: len(notices) >= count, WAIT, f"{count} notices")
            return notices[:count]

        async def scenario() -> None:
            first = _erasing_usage(one, now, counts)
            second = _erasing_usage(two, now, counts)
            for usage in (first, second):
                with pytest.raises(QuotaExceeded):
                    await asyncio.wait_for(usage.check("acme", quota), WAIT)
            assert counts == [0, 0]
            await asyncio.wait_for(first.erasing("acme"), WAIT)  # as the service does: an add before,
            await asyncio.to_thread(one.erase, MemoryKey("acme", "u", "s0"))
            first.erased("acme")  # and one after, on the revision of just before
            for notice in await asyncio.wait_for(told(2), WAIT):  # the log's, then the eraser's repeat
                assert notice.tallied
                assert notice.may_be_of("acme")
                second.erased_everywhere(notice.may_be_of, tallied=notice.tallied)
                first.erased_everywhere(notice.may_be_of, tallied=notice.tallied)
            await asyncio.wait_for(first.check("acme", quota), WAIT)  # admitted: no count
            await asyncio.wait_for(first.close(), WAIT)  # the add under way is done
            await asyncio.wait_for(second.check("acme", quota), WAIT)  # the shared tally read: no count
            assert counts == [0, 0]
            assert first.usage("acme") == second.usage("acme") == _stored(one, "acme") < quota
            # another instance's add lands while the erasure runs: it may be a count that read the
            # stream after the deletes, so the erased bytes are not taken off it, but counted in full
            await asyncio.wait_for(first.erasing("acme"), WAIT)
            await asyncio.to_thread(lambda: two.session(MemoryKey("acme", "u", "s9")).add_turn(turn("late")))
            now[0] = 6.0
            await asyncio.wait_for(second.close(), WAIT)  # its add
            await asyncio.to_thread(one.erase, MemoryKey("acme", "u", "s2"))
            first.erased("acme")
            await asyncio.wait_for(first.close(), WAIT)
            assert counts == [0, 0, 0]
            assert first.usage("acme") == _stored(one, "acme")

        asyncio.run(scenario())
    finally:
        unwatch()
        one.close()
        two.close()


def test_an_erasure_by_a_process_keeping_no_tally_makes_a_full_count(url: str, jetstream_names: Any) -> None:
    """An erasure by a process that keeps no tally (the CLI, another convmem) takes no bytes off: its
    notice says so (`tallied` False; the eraser's repeat says nothing of bytes), and an instance that
    hears it counts the tenant in full before its next refusal."""
    one, other = _system(url, jetstream_names), _system(url, jetstream_names)
    notices: list[ErasureNotice] = []
    unwatch = one.log.watch_erasures(lambda notice: notices.append(notice) if notice else None)  # type: ignore[attr-defined]
    try:
        for n in range(2):
            one.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}" * 30))
        quota = _stored(one, "acme")
        now, counts = [0.0], []  # type: ignore[var-annotated]

        async def scenario() -> None:
            usage = _erasing_usage(one, now, counts)
            with pytest.raises(QuotaExceeded):
                await asyncio.wait_for(usage.check("acme", quota), WAIT)
            await asyncio.to_thread(other.erase, MemoryKey("acme", "u", "s1"))
            await asyncio.to_thread(wait_until, lambda: len(notices) >= 2, WAIT, "2 notices")
            assert [n.tallied for n in notices] == [False, True]  # the erasure's, the repeat
            for notice in notices:
                usage.erased_everywhere(notice.may_be_of, tallied=notice.tallied)
            await asyncio.wait_for(usage.check("acme", quota), WAIT)  # counted in full: room again
            assert counts == [0, 0]
            assert usage.usage("acme") == _stored(one, "acme") < quota

        asyncio.run(scenario())
    finally:
        unwatch()
        one.close()
        other.close()


def test_bytes_written_while_a_full_count_runs_never_make_a_refusal(url: str, jetstream_names: Any) -> None:
    """Writes sent while the tenant's full count runs may be counted twice (read by the count, and
    still this instance's own): the tally keeps them (on the safe side for admitting), but a refusal
    never rests on them, so a tenant below its quota is not refused for them."""
    system = _system(url, jetstream_names)
    try:
        for n in range(2):
            system.session(MemoryKey("acme", "u", "s")).add_turn(turn(f"t{n}"))
        real = counter_of(system.log, asyncio.to_thread)

        async def scenario() -> None:
            entered, released = asyncio.Event(), asyncio.Event()

            async def held(tenant_id: str, after: int) -> tuple[int, int]:
                entered.set()
                await released.wait()
                return await real(tenant_id, after)

            log = system.log
            usage = TenantUsage(
                held,
                tallies=tallies_of(log, asyncio.to_thread),
                appended=appended_of(log),
                recount_every=5.0,
                clock=lambda: 0.0,
            )
            first = asyncio.ensure_future(usage.check("acme", 1 << 30))
            await asyncio.wait_for(entered.wait(), WAIT)
            for n in range(3):  # sent while the count runs: it will read them too
                await asyncio.to_thread(
                    lambda n=n: system.session(MemoryKey("acme", "u", "s")).add_turn(turn(f"w{n}"))
                )
            released.set()
            await asyncio.wait_for(first, WAIT)
            stored = _stored(system, "acme")
            assert usage.usage("acme") > stored  # the three counted twice: admitting stays safe
            await asyncio.wait_for(usage.check("acme", stored + 1), WAIT)  # below the quota: not refused

        asyncio.run(scenario())
    finally:
        system.close()


def test_deletions_no_notice_tells_are_seen_by_a_full_count_before_a_refusal(
    url: str, jetstream_names: Any
) -> None:
    """Messages deleted with no erasure notice (an operator's purge, retention's compaction) stay in
    the tally, so the tenant is refused on it while its last full count is recent; once that count is
    full_every seconds old, the next refusal counts in full first and the tenant has room again."""
    system = _system(url, jetstream_names)
    try:
        for n in range(4):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}" * 30))
        quota = _stored(system, "acme")
        now, counts = [0.0], []  # type: ignore[var-annotated]
        log: Any = system.log

        def purge(n: int) -> None:  # as an operator would (nats stream purge --subject)
            subject = log.subject(MemoryKey("acme", "u", f"s{n}"))
            request = {"filter": subject}
            log._conn.call(lambda: log._conn.api(f"$JS.API.STREAM.PURGE.{log.stream}", request), what="purge")

        async def scenario() -> None:
            usage = _counting_usage(system, now, counts, bound=False)
            with pytest.raises(QuotaExceeded):
                await asyncio.wait_for(usage.check("acme", quota), WAIT)
            await asyncio.to_thread(lambda: [purge(n) for n in range(3)])
            now[0] = 30.0
            with pytest.raises(QuotaExceeded):  # the last full count is 30 s old: refused on the tally
                await asyncio.wait_for(usage.check("acme", quota), WAIT)
            assert counts == [0]
            now[0] = 61.0
            await asyncio.wait_for(usage.check("acme", quota), WAIT)  # a minute old: counted in full
            assert counts == [0, 0]
            assert usage.usage("acme") == _stored(system, "acme") < quota

        asyncio.run(scenario())
    finally:
        system.close()


def test_credentials_that_may_not_use_the_tally_bucket_keep_a_tally_of_the_instance(
    tmp_path: Path, jetstream_names: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A store identity the server refuses the tally bucket's subjects (a deployment whose
    permissions predate it) still has its quota held: the refusal is named at once, and the
    instance keeps a tally of its own (a warning says so), counted in full and refused on."""
    bucket = f"{jetstream_names.stream}_USAGE"
    accounts = (
        "accounts { Q { jetstream: enabled, users: [ { user: svc, password: svc-secret, "
        f'permissions: {{ publish: {{ allow: [">"], deny: ["$KV.{bucket}.>"] }} }} }} ] }} }}'
    )
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=accounts) as server:
        url = f"nats://svc:svc-secret@127.0.0.1:{server.port}"
        system = _system(url, jetstream_names)
        try:
            for n in range(2):
                system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
            now, counts = [0.0], []  # type: ignore[var-annotated]

            async def scenario() -> None:
                usage = _counting_usage(system, now, counts, bound=False)
                await asyncio.wait_for(usage.check("acme", 1 << 30), WAIT)
                assert (counts, usage.usage("acme")) == ([0], _stored(system, "acme"))
                with pytest.raises(QuotaExceeded):
                    await asyncio.wait_for(usage.check("acme", _stored(system, "acme")), WAIT)

            with caplog.at_level("WARNING", logger="convmem.service"):
                asyncio.run(scenario())
            assert "may not be used with these credentials" in caplog.text
        finally:
            system.close()


class _HeldLog(_Log):
    """A `_Log` whose counts wait until `release` (a count of a large tenant, under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    async def count(self, _tenant: str, after: int) -> tuple[int, int]:
        self.counts.append(after)
        self.entered.set()
        await self.released.wait()
        past = {p: s for p, s in self.sizes.items() if p > after}
        return sum(past.values()), max(past, default=after)


def test_a_first_write_the_logs_total_clears_is_admitted_while_the_first_count_runs() -> None:
    """Before a tenant's first count, a write is admitted at once when the log's bytes in all (asked
    once) plus what this instance answered since stay under the quota; the full count runs in the
    background and then rules. A write that bound does not clear waits for the count, as before."""
    log = _HeldLog()
    asked: list[int] = []

    async def bound() -> int:
        asked.append(1)
        return sum(log.sizes.values()) + 50  # the log holds more than the tenant: other tenants

    usage = TenantUsage(log.count, bound=bound, recount_every=5.0, clock=lambda: 0.0)

    async def scenario() -> None:
        log.append(400)
        await asyncio.wait_for(usage.check("acme", 1000), WAIT)  # 450 by the bound: in, the count held
        await asyncio.wait_for(log.entered.wait(), WAIT)  # the full count is under way
        assert (log.counts, usage.usage("acme")) == ([0], None)
        usage.wrote("acme", 300)
        await asyncio.wait_for(usage.check("acme", 1000), WAIT)  # 750 clears: no second ask or count
        assert (len(asked), log.counts) == (1, [0])
        usage.wrote("acme", 300)
        waiting = asyncio.ensure_future(usage.check("acme", 1000))  # 1050: must wait for the count
        await asyncio.sleep(0)
        assert not waiting.done()
        log.append(600)  # what the 600 bytes of requests stored
        log.released.set()
        with pytest.raises(QuotaExceeded) as refused:  # the count rules: 1000 stored, and the 600 the
            await asyncio.wait_for(waiting, WAIT)  # count may or may not have read kept (the safe side)
        assert (refused.value.usage, log.counts) == (1600, [0])

    asyncio.run(scenario())

    over = _HeldLog()
    over.append(1200)
    over.released.set()

    async def above() -> int:
        return 1200

    refusing = TenantUsage(over.count, bound=above, recount_every=5.0, clock=lambda: 0.0)

    async def restarted_over_quota() -> None:  # a restart forgets nothing: the bound does not clear
        with pytest.raises(QuotaExceeded):
            await refusing.check("acme", 1000)
        assert over.counts == [0]

    asyncio.run(restarted_over_quota())


def test_writes_waiting_on_a_count_longer_than_recount_every_all_take_that_one_count(
    url: str, jetstream_names: Any
) -> None:
    """Requests that arrive while a tenant's full count runs take that count when it ends, however
    long it took: a count that outlasts recount_every (a large tenant on a busy machine) must not make
    each waiter count again in turn (the cores bench's unanswered warm-up requests, issue 28)."""
    system = _system(url, jetstream_names)
    try:
        for n in range(3):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
        now, counts = [0.0], []
        real = counter_of(system.log, asyncio.to_thread)

        async def scenario() -> None:
            entered, released = asyncio.Event(), asyncio.Event()

            async def counter(tenant_id: str, after: int) -> tuple[int, int]:  # the log's own count, held
                counts.append(after)
                entered.set()
                await released.wait()
                now[0] += 30.0  # the count took longer than recount_every
                return await real(tenant_id, after)

            usage = TenantUsage(counter, recount_every=5.0, clock=lambda: now[0])
            waiting = [asyncio.ensure_future(usage.check("acme", 1 << 30)) for _ in range(16)]
            await asyncio.wait_for(entered.wait(), WAIT)
            released.set()
            await asyncio.wait_for(asyncio.gather(*waiting), WAIT)
            assert counts == [0]  # one full count for all sixteen, not one each after the other
            assert usage.usage("acme") == system.log.stored_bytes("acme")[0] > 0  # type: ignore[attr-defined]

        asyncio.run(scenario())
    finally:
        system.close()


# The stream's own cap ------------------------------------------------------------------------


def _cap_stream(system: MemorySystem, max_bytes: int, discard: str) -> None:
    """Set the events stream's max_bytes and discard policy, as an operator would (nats stream edit)."""
    log: Any = system.log
    conn = log._conn
    info = conn.call(lambda: conn.api(f"$JS.API.STREAM.INFO.{log.stream}"), what="info")
    config = {**info["config"], "max_bytes": max_bytes, "discard": discard}
    conn.call(lambda: conn.api(f"$JS.API.STREAM.UPDATE.{log.stream}", config), what="update")


def test_a_stream_capped_with_discard_new_is_used_and_refuses_writes_past_the_cap(
    url: str, jetstream_names: Any
) -> None:
    """The operator's safety net (max_bytes, discard new) is accepted: past it StoreFull, nothing
    dropped; a cap that would drop old events (discard old) is refused naming max_bytes."""
    key = MemoryKey("acme", "u", "capped")
    with _system(url, jetstream_names) as system:
        system.session(key).add_turn(turn("first"))
        _cap_stream(system, 8_000, "new")
    with _system(url, jetstream_names) as system:
        session = system.session(key)
        _write_until_refused(session, "t", StoreFull)
        assert system.log.read(key)[1].seq == 2  # nothing dropped: the first turn is still there
        _cap_stream(system, 8_000, "old")
    with pytest.raises(InvalidConfig, match="max_bytes"):
        _system(url, jetstream_names)


# Through `convmem serve` -----------------------------------------------------------------------


def _serve(url: str, folder: Path, config: Path) -> subprocess.Popen[bytes]:
    """`convmem serve --workers 1 --config CONFIG` on `url`, once it says it serves."""
    ready, err = folder / "ready", folder / "serve.err"
    argv = ["--nats", url, "serve", "--workers", "1", "--config", str(config), "--ready-file", str(ready)]
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "convmem", *argv], stdout=subprocess.DEVNULL, stderr=stderr
        )
    while not ready.exists():
        try:  # waiting on the process doubles as the pause between checks
            code = proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"convmem serve exited with {code}: {err.read_text(errors='replace')}")
    return proc


def test_serve_takes_each_tenants_quota_from_its_configuration_file(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """`serve --config` with a [quotas.tenants.acme] table: acme's writes past it are QuotaExceeded
    through the workers, globex's (the default quota) are not."""
    config = tmp_path / "convmem.toml"
    config.write_text(
        'strategy = "truncation"\n[quotas.tenants.acme]\nmax_bytes = "5KiB"\n', encoding="utf-8"
    )
    proc = _serve(nats_server.url, tmp_path, config)
    try:
        with RemoteMemory(nats_server.url, timeout=WAIT) as remote:
            refused = _write_until_refused(remote.session(MemoryKey("acme", "u", "s")), "a", QuotaExceeded)
            assert (refused.limit, refused.allowed) == ("max_bytes", 5 * 1024)
            assert [remote.session(MemoryKey("globex", "v", "s")).add_turn(turn("g")) for _ in range(2)] == [
                1,
                2,
            ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT)


def test_serve_stops_on_a_bad_quota_naming_the_file_and_the_key(tmp_path: Path) -> None:
    """A hostile quotas table stops `serve` before it starts anything, the key named on stderr."""
    config = tmp_path / "convmem.toml"
    config.write_text("[quotas.default]\nmax_in_flight = -3\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "convmem", "--nats", "nats://127.0.0.1:1", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode != 0
    assert "quotas.default.max_in_flight" in done.stderr
    assert str(config) in done.stderr
    assert "Traceback" not in done.stderr


def _bucket_exists(system: MemorySystem, bucket: str) -> bool:
    log: Any = system.log

    async def info() -> bool:
        try:
            await log._conn.api(f"$JS.API.STREAM.INFO.KV_{bucket}")
        except Exception:  # stream not found
            return False
        return True

    return bool(log._conn.call(info, what="bucket info"))


def test_a_service_makes_the_tally_bucket_before_it_takes_a_request(
    url: str, api_prefix: str, jetstream_names: Any
) -> None:
    """The shared tallies' bucket is made and answering when the service starts, not at a tenant's
    first write (in a cluster a bucket made then answers no read until its replicas choose a leader,
    and that write waits out its timeout: `tests/test_cluster.py`'s two-node case)."""
    system = _system(url, jetstream_names)
    bucket = usage_bucket(system.log.stream)  # type: ignore[attr-defined]
    try:
        assert not _bucket_exists(system, bucket)
        with MemoryService(system, url, api_prefix=api_prefix):
            assert _bucket_exists(system, bucket)  # no request was made
    finally:
        system.close()


def test_a_tally_value_that_is_not_a_tally_is_counted_again_in_full(url: str, jetstream_names: Any) -> None:
    """Bytes in a tenant's tally key that are not a tally (not JSON, JSON of another shape, none: an
    operator's put, a damaged store) never fail a write: the tenant is counted in full and the
    tally made again from that count."""
    system = _system(url, jetstream_names)
    log: Any = system.log
    subject = f"$KV.{usage_bucket(log.stream)}.acme"
    try:
        for n in range(3):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
        stored = _stored(system, "acme")
        for garbage in (b"{not json", b'{"bytes": -5}', b"\xff\xfe", b""):  # b"": as a delete leaves it
            now, counts = [0.0], []  # type: ignore[var-annotated]

            async def scenario(
                data: bytes = garbage, counted: list[int] = counts, now: list[float] = now
            ) -> None:
                await asyncio.to_thread(log.prepare_usage_tallies, within=WAIT)
                await asyncio.to_thread(
                    lambda: log._conn.call(lambda: log._conn.js.publish(subject, data), what="put garbage")
                )
                usage = _counting_usage(system, now, counted)
                await asyncio.wait_for(usage.check("acme", stored * 10), WAIT)
                await asyncio.wait_for(usage.close(), WAIT)

            asyncio.run(scenario())
            assert counts == [0], garbage  # counted in full
            assert log.usage_tally("acme")[0] == stored, garbage  # the tally made again from the count
    finally:
        system.close()


# A damaged tally bucket --------------------------------------------------------------------------

_USAGE_BLOCK = "jetstream/$G/streams/KV_CONVMEM_EVENTS_USAGE/msgs/1.blk"


def _tallied(data: Path, writes: int) -> int:
    """`writes` turns of acme in a store at `data` (embedded server, stopped after), its tally made by
    a service instance's full count; acme's stored bytes."""
    with convmem.connect(data_dir=data, snapshot_every=2) as memory:
        for n in range(writes):
            memory.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"), timeout=WAIT)
        stored = _stored(memory, "acme")

        async def count() -> None:
            usage = _counting_usage(memory, [0.0], [], bound=False)
            await asyncio.wait_for(usage.check("acme", stored * 10), WAIT)
            await asyncio.wait_for(usage.close(), WAIT)

        asyncio.run(count())
        assert memory.log.usage_tally("acme")[0] == stored  # type: ignore[attr-defined]
    return stored


def test_a_flipped_byte_in_a_tenants_tally_is_counted_in_full_never_a_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One flipped byte in the tenant's latest tally value: nats-server still counts the message but
    serves none for the key, and a put conditioned on "no tally yet" is stored but never answered:
    every write of the tenant waited out the connection's timeout and failed as 'the NATS server may
    be down'. The instance sees the key counted but not served, counts the tenant in full, keeps its
    tally itself and names the bucket and its repair; the quota still holds."""
    data = tmp_path / "data"
    stored = _tallied(data, 3)
    block = data / _USAGE_BLOCK
    raw = bytearray(block.read_bytes())
    at = raw.rfind(b'"bytes":')
    assert at >= 0
    raw[at + len(b'"bytes":') + 1] ^= 0x01  # a digit of the value
    block.write_bytes(bytes(raw))

    with convmem.connect(data_dir=data, snapshot_every=2) as memory:
        counts: list[int] = []

        async def scenario() -> None:
            usage = _counting_usage(memory, [0.0], counts, bound=False)
            with pytest.raises(QuotaExceeded):  # over: refused on a full count, never a timeout
                await asyncio.wait_for(usage.check("acme", stored), WAIT)
            await asyncio.wait_for(usage.check("acme", stored + 1), WAIT)  # under: admitted
            assert usage.usage("acme") == stored

        with caplog.at_level("WARNING", logger="convmem.jetstream"):
            asyncio.run(scenario())
        assert counts == [0]
        assert "is damaged" in caplog.text
        assert "nats stream purge KV_CONVMEM_EVENTS_USAGE" in caplog.text


def test_a_truncated_tally_block_never_lets_a_tenant_past_its_quota(tmp_path: Path) -> None:
    """The tally bucket's block loses its last record (a truncated file): after a restart the older,
    lower tally of the tenant is current again, and a fresh instance admitted on it writes past the
    quota unnoticed until the stale tally reaches it."""
    data = tmp_path / "data"
    with convmem.connect(data_dir=data, snapshot_every=2) as memory:
        for n in range(3):
            memory.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"), timeout=WAIT)

        async def tally() -> None:  # a tally value after each write: an older, lower one before the last
            usage = _counting_usage(memory, [0.0], [], bound=False)
            await asyncio.wait_for(usage.check("acme", 10**9), WAIT)
            for n in range(3, 6):
                await asyncio.to_thread(
                    lambda n=n: memory.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
                )
                await asyncio.wait_for(usage.check("acme", 10**9), WAIT)
            await asyncio.wait_for(usage.close(), WAIT)

        asyncio.run(tally())
        stored = _stored(memory, "acme")
        assert memory.log.usage_tally("acme")[0] == stored  # type: ignore[attr-defined]
    block = data / _USAGE_BLOCK
    raw = block.read_bytes()
    last = raw.rfind(b"$KV.CONVMEM_EVENTS_USAGE.acme")
    block.write_bytes(raw[: last - 22])  # the last record gone: 22 bytes of record head before its subject

    with convmem.connect(data_dir=data, snapshot_every=2) as memory:
        log: Any = memory.log
        held = log._conn.call(
            lambda: log._conn.get_message(
                "KV_CONVMEM_EVENTS_USAGE", {"last_by_subj": "$KV.CONVMEM_EVENTS_USAGE.acme"}
            ),
            what="read the tally as stored",
        )
        stale = json.loads(held.data)["bytes"]
        assert stale < stored  # the older tally is current again

        async def fresh() -> None:
            usage = _counting_usage(memory, [0.0], [], bound=False)
            with pytest.raises(QuotaExceeded):  # already over: never admitted on the stale tally
                await asyncio.wait_for(usage.check("acme", (stale + stored) // 2), WAIT)

        asyncio.run(fresh())


def test_a_tally_that_went_back_under_a_running_instance_is_counted_in_full(
    url: str, jetstream_names: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each tally value carries the events-stream position it counts through: a value older than
    one this process read or wrote (a restored or truncated bucket under a running instance) is
    never admitted on, even when the tenant has no event past it: the tenant is counted in full."""
    system = _system(url, jetstream_names)
    log: Any = system.log
    subject = f"$KV.{usage_bucket(log.stream)}.acme"
    try:
        for n in range(3):
            system.session(MemoryKey("acme", "u", f"s{n}")).add_turn(turn(f"t{n}"))
        acme_last = log.stored_bytes("acme")[1]  # the position of acme's last event
        for n in range(3):
            system.session(MemoryKey("globex", "u", f"s{n}")).add_turn(turn(f"other {n}"))
        stored = _stored(system, "acme")

        async def scenario() -> None:
            counts: list[int] = []
            first = _counting_usage(system, [0.0], counts, bound=False)
            await asyncio.wait_for(first.check("acme", stored * 10), WAIT)  # the tally: through globex's
            await asyncio.wait_for(first.close(), WAIT)
            assert counts == [0]
            old = json.dumps({"bytes": 1, "at": acme_last}).encode()  # acme has no event past it
            await asyncio.to_thread(
                lambda: log._conn.call(lambda: log._conn.js.publish(subject, old), what="put an old tally")
            )
            counts.clear()
            again = _counting_usage(system, [0.0], counts, bound=False)
            with pytest.raises(QuotaExceeded):  # never admitted on the old value of 1 byte
                await asyncio.wait_for(again.check("acme", stored), WAIT)
            assert counts == [0]

        with caplog.at_level("WARNING", logger="convmem.jetstream"):
            asyncio.run(scenario())
        assert "went back" in caplog.text
    finally:
        system.close()


def test_verify_all_names_a_damaged_tally_and_its_repair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convmem verify --all` asks the tally bucket for each tenant's key: one the stream counts but
    serves none of is damage (exit 7), named with the tenant, the bucket and its repair (also in
    --json: tally_damage); with the bucket purged, as the line says, it passes."""
    data = tmp_path / "data"
    _tallied(data, 3)

    def verify(*extra: str) -> tuple[int, str]:
        code = main(["--data-dir", str(data), "verify", "--all", *extra])
        out, err = capsys.readouterr()
        return code, out + err

    assert verify()[0] == 0  # a sound tally is no damage
    block = data / _USAGE_BLOCK
    raw = bytearray(block.read_bytes())
    at = raw.rfind(b'"bytes":')
    raw[at + len(b'"bytes":') + 1] ^= 0x01
    block.write_bytes(bytes(raw))

    code, out = verify()
    assert code == 7, out
    assert "byte tally: DAMAGED: tenant 'acme' in KV_CONVMEM_EVENTS_USAGE" in out
    assert "repair: nats stream purge KV_CONVMEM_EVENTS_USAGE" in out
    code, out = verify("--json")
    assert code == 7
    assert json.loads(out[out.index("{") :])["tally_damage"] == ["acme"]

    with convmem.connect(data_dir=data, snapshot_every=2) as memory:  # the repair the line names
        log: Any = memory.log
        log._conn.call(lambda: log._conn.api("$JS.API.STREAM.PURGE.KV_CONVMEM_EVENTS_USAGE"), what="purge")
    assert verify()[0] == 0
