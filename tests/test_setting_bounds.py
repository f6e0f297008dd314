"""Every number from outside has an upper bound that keeps the process working, and a refusal names it.

A `MemorySystem` / `connect()` setting, a handle call's ``timeout``, a configuration's seconds: each
is checked where it comes in, against a bound (seconds: a day; threads: 4,096; live sessions and
queued summaries: 1,000,000; ...). NaN, the infinities and bools are refused too. The refusal is
`InvalidConfig` (`InvalidInput` for a call's own argument) naming the setting and its bound, and
nothing is stored. The largest value allowed still works: a wait of a day overflows nothing.

A configuration stored by a version before the bounds still replays as it was, and its timers
never stop the system's timer thread (past about 9.2e9 seconds a wait overflowed time_t and the
thread died with every timer of the system).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import (
    WAIT,
    EchoSummarizer,
    PlannedSummarizer,
    key,
    summarizing_config,
    turn,
    users,
    wait_until,
)

import convmem
from convmem.actors import MemorySystem, SummarizerPool
from convmem.actors._bounds import (
    MAX_ACTOR_THREADS,
    MAX_CACHE_BYTES,
    MAX_LIVE_SESSIONS,
    MAX_QUEUED,
    MAX_SNAPSHOT_EVERY,
)
from convmem.actors._clock import SystemClock
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryEventLog,
    JetStreamBackend,
    MemoryService,
    open_backend,
)
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._log import JetStreamEventLog
from convmem.adapters.backends.summarizers import (
    ExtractiveSummarizer,
    OpenAIChatSummarizer,
    ProcessSummarizer,
)
from convmem.errors import InvalidConfig, InvalidInput
from convmem.events import (
    MAX_WAIT_SECONDS,
    AgentsMemoryConfig,
    ConversationMemoryConfig,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    RetentionPolicies,
    RetentionPolicy,
    SessionStarted,
    ShortTermMemoryConfig,
    decode_event,
    encode_event,
)
from convmem.events._checks import as_stored
from convmem.events._config import MAX_BACKOFF_STEPS
from convmem.projections import SessionState, agent_items, decode_state, encode_state

DAY = 86_400.0
K = key("bounds")

# -- MemorySystem / connect() settings --------------------------------------------------------------

SETTINGS: list[tuple[str, object, str]] = [
    # (setting, a value past its bound, the bound its message names)
    ("max_live_sessions", MAX_LIVE_SESSIONS + 1, "1,000,000"),
    ("max_live_sessions", 10**30, "1,000,000"),
    ("max_live_sessions", True, "1,000,000"),
    ("max_live_sessions", 2.5, "1,000,000"),
    ("max_live_sessions", math.nan, "1,000,000"),
    ("idle_seconds", DAY + 1, "86400"),
    ("idle_seconds", 1e12, "86400"),
    ("idle_seconds", math.inf, "86400"),
    ("idle_seconds", math.nan, "86400"),
    ("idle_seconds", True, "86400"),
    ("timeout", math.nan, "86400"),
    ("timeout", True, "86400"),
    ("idle_cache_bytes", MAX_CACHE_BYTES + 1, "1,152,921,504,606,846,976"),
    ("snapshot_every", MAX_SNAPSHOT_EVERY + 1, "1,000,000"),
    ("snapshot_every", 2.5, "1,000,000"),
    ("actor_threads", 2.5, "4,096"),
    ("actor_threads", True, "4,096"),
    ("summarizer_workers", True, "4,096"),
    ("summarizer_queue", MAX_QUEUED + 1, "1,000,000"),
    ("summarizer_queue", 10**30, "1,000,000"),
    ("summarizer_abandoned", MAX_ACTOR_THREADS + 1, "4,096"),
    ("summarizer_abandoned", 10**30, "4,096"),
]


@pytest.mark.parametrize(("setting", "value", "bound"), SETTINGS, ids=[f"{s}={v!r}" for s, v, _ in SETTINGS])
def test_a_system_setting_past_its_bound_is_invalid_config_naming_it_and_the_bound(
    setting: str, value: object, bound: str
) -> None:
    log = InMemoryEventLog()
    with pytest.raises(InvalidConfig) as caught:
        MemorySystem(log=log, **{setting: value})  # type: ignore[arg-type]
    assert caught.value.field == setting
    assert str(caught.value).startswith(f"{setting}: must be")
    assert bound in caught.value.problem
    assert log.keys() == []  # nothing stored
    with pytest.raises(InvalidConfig, match=f"^{setting}: "):
        convmem.connect("memory://", **{setting: value})  # type: ignore[arg-type]


@given(
    setting=st.sampled_from(["max_live_sessions", "snapshot_every", "summarizer_queue"]),
    value=st.integers(min_value=1_000_001) | st.integers(max_value=0),
)
def test_any_count_outside_its_range_is_refused(setting: str, value: int) -> None:
    with pytest.raises(InvalidConfig, match=f"^{setting}: must be a whole number from 1 to 1,000,000"):
        MemorySystem(log=InMemoryEventLog(), **{setting: value})  # type: ignore[arg-type]


@given(
    setting=st.sampled_from(["idle_seconds", "timeout"]),
    value=st.floats(min_value=DAY, exclude_min=True) | st.floats(max_value=0.0) | st.just(math.nan),
)
def test_any_seconds_outside_zero_to_a_day_are_refused(setting: str, value: float) -> None:
    with pytest.raises(InvalidConfig, match=f"^{setting}: must be seconds > 0 and <= 86400 \\(a day\\)"):
        MemorySystem(log=InMemoryEventLog(), **{setting: value})  # type: ignore[arg-type]


def test_every_setting_at_its_largest_still_works() -> None:
    """The bounds themselves are allowed: a day's idle time and timeout, a million live sessions,
    queued summaries and events between snapshots, 4,096 abandoned calls, an exbibyte of cache."""
    with MemorySystem(
        summarizing_config(),
        log=InMemoryEventLog(),
        summarizer=EchoSummarizer(),
        max_live_sessions=MAX_LIVE_SESSIONS,
        idle_seconds=DAY,
        timeout=DAY,
        idle_cache_bytes=MAX_CACHE_BYTES,
        snapshot_every=MAX_SNAPSHOT_EVERY,
        summarizer_queue=MAX_QUEUED,
        summarizer_abandoned=MAX_ACTOR_THREADS,
    ) as system:
        session = system.session(K)
        for n in range(4):
            assert session.add_turn(turn(f"t{n}")) == n + 1
        session.flush(timeout=WAIT)
        assert session.snapshot_state().summary.startswith("covers")
        assert_timers_fire(system)


def assert_timers_fire(system: MemorySystem) -> None:
    """The system's timer thread still runs timers (it died when a wait overflowed)."""
    fired = threading.Event()
    system.clock.call_at(system.clock.now(), fired.set)
    assert fired.wait(WAIT), "the system's timer thread no longer runs timers"


# -- a call's own timeout ---------------------------------------------------------------------------

BAD_TIMEOUTS = [DAY + 1, 1e12, math.inf, math.nan, -1.0, True, "soon"]


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_a_calls_timeout_past_a_day_or_not_a_number_is_refused_before_anything_is_stored(bad: Any) -> None:
    log = InMemoryEventLog()
    with MemorySystem(log=log) as system:
        session = system.session(K)
        calls = [
            lambda: session.add_turn(turn("kept out"), timeout=bad),
            lambda: session.start(timeout=bad),
            lambda: session.add_items([{"role": "user", "content": "kept out"}], timeout=bad),
            lambda: session.pop_item(timeout=bad),
            lambda: session.clear(timeout=bad),
            lambda: session.flush(timeout=bad),
            lambda: session.refresh(timeout=bad),
            lambda: asyncio.run(session.aio.add_turn(turn("kept out"), timeout=bad)),
            lambda: asyncio.run(session.aio.flush(timeout=bad)),
        ]
        for call in calls:
            with pytest.raises(InvalidInput) as caught:
                call()
            assert caught.value.field == "timeout"
            assert "must be seconds >= 0 and <= 86400 (a day)" in caught.value.problem
        assert log.keys() == []  # nothing stored, the session not even started


def test_a_calls_timeout_of_a_day_works() -> None:
    with MemorySystem(log=InMemoryEventLog()) as system:
        session = system.session(K)
        assert session.add_turn(turn("a"), timeout=DAY) == 1
        assert asyncio.run(session.aio.add_turn(turn("b"), timeout=DAY)) == 2
        session.flush(timeout=DAY)
        assert users(session.refresh(timeout=DAY)) == ["a", "b"]


# -- the configuration's seconds --------------------------------------------------------------------

SECONDS_FIELDS = [
    ({"summarize_timeout_seconds": DAY + 0.5}, "health.summarize_timeout_seconds"),
    ({"degraded_retry_seconds": 1e12}, "health.degraded_retry_seconds"),
    ({"retry_backoff_seconds": (2.0, 1e12)}, "health.retry_backoff_seconds[1]"),
    ({"summarize_timeout_seconds": 10**200}, "health.summarize_timeout_seconds"),
]


@pytest.mark.parametrize(("fields", "field"), SECONDS_FIELDS, ids=[f for _, f in SECONDS_FIELDS])
def test_a_configured_wait_past_a_day_is_invalid_config_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidConfig) as caught:
        HealthPolicy(**fields)
    assert caught.value.field == field
    assert "at most 86400 seconds (a day)" in caught.value.problem
    assert len(str(caught.value)) < 200  # a huge number is cut, not printed whole


@given(st.floats(min_value=DAY, exclude_min=True, allow_infinity=False))
def test_any_summarize_timeout_past_a_day_is_refused(seconds: float) -> None:
    with pytest.raises(InvalidConfig, match=r"^health\.summarize_timeout_seconds: must be at most 86400"):
        HealthPolicy(summarize_timeout_seconds=seconds)


def test_more_backoff_intervals_than_a_config_holds_are_refused() -> None:
    assert len(HealthPolicy(retry_backoff_seconds=(1.0,) * MAX_BACKOFF_STEPS).retry_backoff_seconds) == 100
    with pytest.raises(InvalidConfig, match=r"^health\.retry_backoff_seconds: holds at most 100 intervals"):
        HealthPolicy(retry_backoff_seconds=(1.0,) * (MAX_BACKOFF_STEPS + 1))


def test_a_config_file_with_a_wait_past_a_day_is_refused_naming_the_key(tmp_path: Any) -> None:
    from convmem.adapters.frontends.cli._common import CliError  # noqa: PLC0415 - the CLI's reader
    from convmem.adapters.frontends.cli._serve import load_config  # noqa: PLC0415

    path = tmp_path / "serve.toml"
    path.write_text("[health]\nsummarize_timeout_seconds = 1e12\n", encoding="utf-8")
    with pytest.raises(CliError) as caught:
        load_config(path)
    assert caught.value.code == 5
    assert str(path) in str(caught.value)
    assert "health.summarize_timeout_seconds" in str(caught.value)
    assert "at most 86400" in str(caught.value)


def test_a_session_whose_waits_are_a_day_summarizes_retries_and_keeps_its_timers() -> None:
    """Every configured wait at its bound: a summary's time limit of a day, a day's back-off and
    DEGRADED probe; the summary is made, a failure goes to RETRY, and the timers still fire."""
    config = summarizing_config(
        summarize_timeout_seconds=DAY, backoff=(DAY,), degraded_retry_seconds=DAY, retry_attempts=1
    )
    summarizer = PlannedSummarizer("ok", default="fail")
    with MemorySystem(config, log=InMemoryEventLog(), summarizer=summarizer) as system:
        session = system.session(K)
        for n in range(3):
            session.add_turn(turn(f"t{n}"))
        wait_until(lambda: session.snapshot_state().summary.startswith("covers"), message="the summary")
        session.add_turn(turn("t3"))  # the next summary fails: RETRY, its back-off a day away
        wait_until(lambda: session.snapshot_state().health is MemoryHealth.RETRY, message="RETRY")
        assert_timers_fire(system)  # the day-long timers are scheduled: the thread sleeps, it does not die


# -- configurations stored before the bounds --------------------------------------------------------


def legacy_config() -> ShortTermMemoryConfig:
    """A configuration a version before the bounds stored: waits of 1e12 seconds."""
    with as_stored():
        return summarizing_config(
            summarize_timeout_seconds=1e12, backoff=(1e12,), degraded_retry_seconds=1e12, retry_attempts=1
        )


def test_a_config_stored_before_the_bounds_still_decodes_from_an_event_and_a_snapshot() -> None:
    old = legacy_config()
    started = SessionStarted(key=K, config=old, seq=1, at=1.0, event_id="e1")
    decoded = decode_event(encode_event(started))
    assert isinstance(decoded, SessionStarted)
    assert decoded.config.health.summarize_timeout_seconds == 1e12
    state = msgspec.structs.replace(SessionState(), config=old)
    assert decode_state(encode_state(state)).config == old
    with pytest.raises(InvalidConfig):  # the bound is back once the decode is over
        HealthPolicy(summarize_timeout_seconds=1e12)


def test_a_session_stored_with_waits_past_a_day_replays_and_its_timers_never_stop_the_clock() -> None:
    """It replays as it was (its turns stored, its summary asked for, its failure retried after
    1e12 s), and the system's timers still fire."""
    log = InMemoryEventLog()
    log.append(
        K, [SessionStarted(key=K, config=legacy_config(), seq=1, at=1.0, event_id="e1")], expected_seq=0
    )
    summarizer = PlannedSummarizer("fail", default="ok")
    with MemorySystem(log=log, summarizer=summarizer) as system:
        assert isinstance(system.clock, SystemClock)
        session = system.session(K)
        for n in range(3):
            session.add_turn(turn(f"t{n}"))
        summarizer.wait_calls(1)
        assert_timers_fire(system)
        assert users(session.snapshot_state()) == ["t0", "t1", "t2"]


def test_a_timer_far_past_what_a_wait_can_hold_never_stops_the_others() -> None:
    clock = SystemClock()
    try:
        fired = threading.Event()
        clock.call_at(clock.now() + 1e12, fired.set)  # past time_t as a wait: the thread must not die
        clock.call_at(clock.now() + MAX_WAIT_SECONDS * 10**6, fired.set)
        clock.call_at(clock.now(), fired.set)
        assert fired.wait(WAIT)
    finally:
        clock.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workers": MAX_ACTOR_THREADS + 1}, "workers"),
        ({"workers": True}, "workers"),
        ({"max_abandoned": 10**9}, "max_abandoned"),
        ({"queue_limit": 10**30}, "queue_limit"),
        ({"call_timeout": 1e12}, "call_timeout"),
        ({"call_timeout": math.nan}, "call_timeout"),
    ],
)
def test_a_summarizer_pool_past_its_bounds_is_refused(kwargs: dict[str, Any], field: str) -> None:
    """The pool's own sizes (it is public): threads, queued jobs, and a call limit of at most two days
    (a system gives it twice its configuration's summary time limit)."""
    with pytest.raises(InvalidConfig) as caught:
        SummarizerPool(lambda payload: "s", **kwargs)
    assert caught.value.field == field


# -- retention policies -----------------------------------------------------------------------------

INT64 = 2**63 - 1


@pytest.mark.parametrize(
    ("policy", "field", "says"),
    [
        ({"default": {"max_turns": INT64 + 1}}, "retention.default.max_turns", "from 1 to 2**63 - 1"),
        ({"tenants": {"acme": {"max_events": 10**400}}}, "retention.tenants.acme.max_events", "2**63 - 1"),
        ({"default": {"max_turns": 2.0}}, "retention.default.max_turns", "2**63 - 1"),
        ({"sweep_every": "2d"}, "retention.sweep_every", "over a day"),
        ({"sweep_every": DAY + 1}, "retention.sweep_every", "over a day"),
        ({"sweep_every": math.nan}, "retention.sweep_every", "above zero"),
    ],
)
def test_a_retention_count_or_sweep_interval_past_its_bound_is_refused_naming_the_key(
    policy: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidConfig) as caught:
        RetentionPolicies.parse(policy)
    assert caught.value.field == field
    assert says in caught.value.problem
    assert len(str(caught.value)) < 200
    with pytest.raises(InvalidConfig, match=f"^{field}: "):
        convmem.connect("memory://", retention=policy)


def test_the_python_retention_types_hold_the_same_bounds() -> None:
    with pytest.raises(InvalidConfig, match=r"^max_turns: must be a whole number from 1 to 2\*\*63 - 1"):
        RetentionPolicy(max_turns=INT64 + 1)
    with pytest.raises(InvalidConfig, match=r"^retention\.sweep_every: .* over a day"):
        RetentionPolicies(sweep_every=7 * DAY)


def test_a_policy_file_with_a_count_past_the_bound_is_exit_5_naming_the_file_and_key(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from convmem.adapters.frontends.cli._main import main  # noqa: PLC0415

    path = tmp_path / "policy.toml"
    path.write_text(f'sweep_every = "1h"\n[default]\nmax_turns = {INT64}\nmax_events = 1{"0" * 30}\n')
    code = main(["-s", "memory://", "retention", "--dry-run", "--policy", str(path)])
    err = capsys.readouterr().err
    assert code == 5, err
    assert str(path) in err
    assert "retention.default.max_events" in err
    assert "0" * 30 not in err


def test_retention_policies_at_their_largest_still_sweep() -> None:
    """A century's idle time and max age, counts of 2**63 - 1 and a daily sweep: a sweep runs, keeps
    what is younger, and nothing overflows (the cutoff is a century before the system's clock)."""
    policies = {
        "default": {"idle": "36500d", "max_age": "36500d", "max_turns": INT64, "max_events": INT64},
        "sweep_every": "1d",
    }
    with convmem.connect("memory://", retention=policies) as system:
        session = system.session(K)
        session.add_turn(turn("kept"))
        report = system.sweep_retention()
        assert report.sessions == 1
        assert report.outcomes == []
        assert report.problems == []
        assert users(session.refresh()) == ["kept"]


# -- where the log is, and the service's clients ----------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("replicas", 6, "from 1 to 5"),
        ("replicas", 10**6, "from 1 to 5"),
        ("replicas", True, "from 1 to 5"),
        ("replicas", 2.5, "from 1 to 5"),
        ("port", 65536, "from 1 to 65,535"),
        ("port", -1, "from 1 to 65,535"),
        ("port", True, "from 1 to 65,535"),
        ("timeout", 1e12, "<= 86400 (a day)"),
    ],
)
def test_a_backend_number_out_of_range_is_refused_before_anything_opens(
    setting: str, value: object, says: str, tmp_path: Any
) -> None:
    """Checked before a server starts or a folder is made (a bool port reached the embedded server's
    configuration file, port -1 was an internal error, 10**6 replicas were accepted)."""
    folder = tmp_path / "never-made"
    with pytest.raises(InvalidConfig) as caught:
        convmem.connect(None, data_dir=folder, **{setting: value})  # type: ignore[arg-type]
    assert caught.value.field == setting
    assert says in caught.value.problem
    assert not folder.exists()
    with pytest.raises(InvalidConfig, match=f"^{setting}: "):
        open_backend("memory://", **{setting: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [DAY + 1, 1e12, math.inf, math.nan, 0.0, -1.0, True])
def test_a_service_clients_timeout_past_a_day_is_refused_before_it_connects(bad: Any) -> None:
    """`connect_remote(timeout=)` and a remote session's own: checked before any connection is tried
    (1e12 overflowed time_t)."""
    with pytest.raises(InvalidInput) as caught:
        convmem.connect_remote("nats://127.0.0.1:1", timeout=bad)
    assert caught.value.field == "timeout"
    assert "must be seconds > 0 and <= 86400 (a day)" in caught.value.problem


# -- the CLI's flags and CONVMEM_* variables --------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["serve", "--max-live-sessions", "1000001"],
            "--max-live-sessions: '1000001' must be at most 1000000",
        ),
        (["serve", "--max-live-sessions", "0"], "--max-live-sessions: '0' must be 1 or more"),
        (
            ["status", "-s", "nats://127.0.0.1:1", "--expect", "10001"],
            "--expect: '10001' must be at most 10000",
        ),
        (["demo", "--planners", "4097"], "--planners: '4097' must be at most 4096"),
        (
            ["serve", "--timeout", "86401"],
            "--timeout: '86401' must be a number of seconds above 0 and at most",
        ),
    ],
)
def test_a_cli_count_past_its_bound_is_exit_2_naming_the_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused when parsed, before anything opens (``status --expect 10**9`` built a row per silent
    replica: a billion rows; ``--max-live-sessions`` had no bound at all)."""
    from convmem.adapters.frontends.cli._main import main  # noqa: PLC0415

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert says in err


def test_a_serve_variable_past_its_bound_is_exit_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from convmem.adapters.frontends.cli._main import main  # noqa: PLC0415

    monkeypatch.setenv("CONVMEM_MAX_LIVE_SESSIONS", str(10**12))
    code = main(["serve"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "CONVMEM_MAX_LIVE_SESSIONS='1000000000000'" in err
    assert "must be at most 1000000" in err


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("CONVMEM_MAX_LIVE_SESSIONS", str(10**12), "from 1 to 1,000,000"),
        ("CONVMEM_ACTOR_THREADS", "100000", "from 1 to 4,096"),
        ("CONVMEM_SUMMARIZER_WORKERS", "0", "from 1 to 4,096"),
        ("CONVMEM_REPLICAS", "7", "from 1 to 5"),
    ],
)
def test_the_penguiflow_drop_in_names_the_variable_past_its_bound(
    variable: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop-in's process-wide system reads the variables `convmem serve` reads, with its bounds."""
    import convmem.penguiflow  # noqa: PLC0415

    monkeypatch.setenv("CONVMEM_NATS_URL", "memory://")
    monkeypatch.setenv(variable, value)
    convmem.penguiflow.configure()
    try:
        with pytest.raises(InvalidConfig) as caught:
            convmem.penguiflow.current_system()
        assert caught.value.field == variable
        assert says in caught.value.problem
    finally:
        convmem.penguiflow.close()


# -- summarizers' own options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: OpenAIChatSummarizer(base_url="http://127.0.0.1:1", timeout=1e12), "timeout"),
        (lambda: OpenAIChatSummarizer(base_url="http://127.0.0.1:1", timeout=math.nan), "timeout"),
        (lambda: OpenAIChatSummarizer(base_url="http://127.0.0.1:1", max_tokens=2**63), "max_tokens"),
        (lambda: ProcessSummarizer("json:dumps", timeout=1e12, start=False), "timeout"),
        (lambda: ExtractiveSummarizer(max_tokens=2**63), "max_tokens"),
        (lambda: ExtractiveSummarizer(cache_size=10**9), "cache_size"),
    ],
)
def test_a_summarizer_option_past_its_bound_is_invalid_config(build: Any, field: str) -> None:
    """A summarizer's wait is at most a day (1e12 overflowed the HTTP client's socket wait), its
    budget at most what a configuration holds, its cache at most a pool per live session."""
    with pytest.raises(InvalidConfig) as caught:
        build()
    assert caught.value.field == field


def test_summarizer_options_at_their_bounds_are_accepted() -> None:
    with OpenAIChatSummarizer(base_url="http://127.0.0.1:1", timeout=DAY, max_tokens=2**63 - 1):
        pass
    ExtractiveSummarizer(max_tokens=2**63 - 1, cache_size=MAX_LIVE_SESSIONS)
    ProcessSummarizer("json:dumps", timeout=DAY, start=False).close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"replicas": 6}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"timeout": 1e12}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"duplicate_window": 1e12}, "duplicate_window"),
    ],
)
def test_the_jetstream_backend_refuses_a_number_out_of_range_before_it_connects(
    options: dict[str, Any], field: str
) -> None:
    """The backends used directly (not through connect()) hold the same bounds: nothing listens at the
    URL, so an InvalidConfig (not LogUnavailable) shows the refusal came first."""
    with pytest.raises(InvalidConfig) as caught:
        JetStreamBackend.connect("nats://127.0.0.1:1", **options)
    assert caught.value.field == field
    with pytest.raises(InvalidConfig, match=f"^{field}: "):
        JetStreamEventLog.connect("nats://127.0.0.1:1", **options)


def test_the_embedded_backend_refuses_a_port_out_of_range_before_it_starts(tmp_path: Any) -> None:
    folder = tmp_path / "never-made"
    for port in (0, 65536, True):
        with pytest.raises(InvalidConfig, match=r"^port: must be a whole number from 1 to 65,535"):
            JetStreamBackend.embedded(folder, port=port)  # type: ignore[arg-type]
    assert not folder.exists()


@pytest.mark.parametrize(
    ("options", "field"), [({"read_batch": 10**9}, "read_batch"), ({"replicas": 6}, "replicas")]
)
def test_a_jetstream_log_on_a_connection_refuses_its_own_numbers_out_of_range(
    nats_server: EmbeddedNatsServer, options: dict[str, Any], field: str
) -> None:
    connection = NatsConnection.connect(nats_server.url, timeout=WAIT)
    try:
        with pytest.raises(InvalidConfig, match=f"^{field}: must be a whole number from 1 to "):
            JetStreamEventLog(connection, **options)
    finally:
        connection.release()


# -- a call's other numbers, and the configuration's counts -----------------------------------------


@pytest.mark.parametrize("seq", [2**63, 2**64, 10**30, 0, True, 2.0])
def test_an_adopted_source_seq_past_what_an_event_holds_is_invalid_input_and_nothing_is_stored(
    seq: Any,
) -> None:
    """2**64 reached the codec: a bare OverflowError after the write was decided."""
    log = InMemoryEventLog()
    with MemorySystem(log=log) as system:
        source, target = key("source"), key("target")
        system.session(source).add_turn(turn("moved"))
        with pytest.raises(InvalidInput) as caught:
            system.session(target).adopt(source, seq, [turn("moved")])
        assert caught.value.field == "source_seq"
        assert "from 1 to 2**63 - 1" in caught.value.problem
        assert log.read(target) == []


def test_the_configurations_counts_at_the_codecs_bound_still_run_a_session() -> None:
    """Budgets, windows and horizons are bounded by the largest whole number an event stores
    (2**63 - 1): what they keep is bounded by the session's history, as ``live_turns=None`` is,
    and nothing sized by them is allocated; a session with every count at that bound writes,
    summarizes, shows its views and forks."""
    most = 2**63 - 1
    config = ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(
            full_zone_turns=1, summary_max_tokens=most, total_max_tokens=most, recall_max_tokens=most
        ),
        recovery_backlog_limit=most,
        retry_attempts=most,
        idempotency_horizon=most,
        live_turns=most,
        agents=AgentsMemoryConfig(
            strategy="compacting",
            max_turns=most,
            context_limit=most,
            compact_trigger_turns=most,
            compact_keep=most,
        ),
        memories=ConversationMemoryConfig(
            max_messages=most, window_size=most, entity_max=most, entity_recent_messages=most
        ),
    )
    with convmem.connect("memory://", config=config) as system:
        session = system.session(K)
        for n in range(4):
            session.add_turn(turn(f"My name is Ada and I like item {n}."), idempotency_key=f"k{n}")
        session.flush(timeout=WAIT)
        assert session.snapshot_state().summary
        assert "recalled" in session.get_llm_context("item 2")["conversation_memory"]
        assert agent_items(session.snapshot_state())
        assert system.fork(K, to=key("fork")).events > 0


@pytest.mark.parametrize("bad", [1e12, math.nan, -1.0])
def test_a_framework_sessions_timeout_is_refused_when_it_is_made(bad: float) -> None:
    """LangChain's history (the Agents session shares the same items) refuses it at construction,
    before its first call could store anything."""
    from convmem.adapters.frontends.integrations.langchain import ConvmemChatMessageHistory  # noqa: PLC0415

    with convmem.connect("memory://") as system:
        with pytest.raises(InvalidInput, match=r"^timeout: must be seconds >= 0 and <= 86400"):
            ConvmemChatMessageHistory("chat", system, tenant_id="acme", user_id="u", timeout=bad)
        assert (
            ConvmemChatMessageHistory("chat", system, tenant_id="acme", user_id="u", timeout=DAY).messages
            == []
        )


def test_the_metrics_tenants_and_port_are_bounded() -> None:
    """Tenants counted apart (each a label set held in memory) at most 1,000,000; a port past 65535
    was a bare OverflowError from the socket."""
    from convmem.adapters.backends._prometheus import PrometheusMetrics  # noqa: PLC0415

    with pytest.raises(InvalidConfig, match=r"^max_tenants: must be a whole number from 1 to 1,000,000"):
        PrometheusMetrics(max_tenants=MAX_LIVE_SESSIONS + 1)
    metrics = PrometheusMetrics(max_tenants=MAX_LIVE_SESSIONS)
    for port in (65536, 10**6, -1, True):
        with pytest.raises(InvalidConfig, match=r"^metrics_port: must be a whole number from 0 to 65,535"):
            metrics.serve(port)  # type: ignore[arg-type]


SERVICE_BOUNDS = [
    ("max_concurrency", 0),
    ("max_concurrency", 10**9),
    ("max_concurrency", True),
    ("max_timeout", 1e12),
    ("max_timeout", float("nan")),
    ("drain_timeout", float("inf")),
    ("connect_timeout", 1e12),
    ("connect_timeout", 0),
    ("status_timeout", 1e12),
    ("status_timeout", -1),
]


@pytest.mark.parametrize(("option", "value"), SERVICE_BOUNDS, ids=[f"{o}={v!r}" for o, v in SERVICE_BOUNDS])
def test_a_service_option_out_of_range_is_invalid_config_naming_it(option: str, value: object) -> None:
    """`MemoryService`'s own options (a thread per concurrent request; waits that must fit a timer)
    are refused when the service is made, naming the option, before anything connects."""
    with (
        MemorySystem(ShortTermMemoryConfig(), log=InMemoryEventLog()) as system,
        pytest.raises(InvalidConfig) as raised,
    ):
        MemoryService(system, "nats://127.0.0.1:1", **{option: value})
    assert raised.value.field == option


def test_a_service_with_every_option_at_its_bound_is_made() -> None:
    with MemorySystem(ShortTermMemoryConfig(), log=InMemoryEventLog()) as system:
        service = MemoryService(
            system,
            "nats://127.0.0.1:1",
            max_concurrency=4096,
            max_timeout=86400,
            drain_timeout=86400,
            connect_timeout=86400,
            status_timeout=86400,
        )
        assert service.max_concurrency == 4096
