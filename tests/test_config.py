"""Configuration: the seed's fields and defaults, validation naming the field, stable encoding."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from strategies import full_configs

import convmem
from convmem.actors import MemorySystem, SystemOptions, SystemSettings
from convmem.adapters import BackendOptions, ConnectOptions, InMemoryEventLog
from convmem.errors import EventDecodeError, InvalidConfig, InvalidInput, UnknownSetting
from convmem.events import (
    AgentsMemoryConfig,
    ConversationMemoryConfig,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    MemoryIsolation,
    ShortTermMemoryConfig,
    decode_event,
)


def test_budget_defaults_are_the_seeds() -> None:
    """MemoryBudget defaults: 5 full-zone turns, 1000 summary tokens, 10000 total, truncate_oldest."""
    budget = MemoryBudget()
    assert (budget.full_zone_turns, budget.summary_max_tokens, budget.total_max_tokens) == (5, 1000, 10000)
    assert budget.overflow_policy == "truncate_oldest"


def test_config_defaults_are_the_seeds() -> None:
    """ShortTermMemoryConfig defaults: strategy none, digest on, backlog 20, 3 retries, no model."""
    config = ShortTermMemoryConfig()
    assert config.strategy == "none"
    assert config.include_trajectory_digest is True
    assert config.recovery_backlog_limit == 20
    assert config.retry_attempts == 3
    assert config.summarizer_model is None
    assert config.budget == MemoryBudget()
    assert config.isolation == MemoryIsolation()
    assert not config.summarizes


def test_isolation_defaults_are_fail_closed() -> None:
    """MemoryIsolation reads tenant_id/user_id/session_id and requires an explicit key."""
    isolation = MemoryIsolation()
    assert (isolation.tenant_key, isolation.user_key, isolation.session_key) == (
        "tenant_id",
        "user_id",
        "session_id",
    )
    assert isolation.require_explicit_key is True


def test_health_defaults_are_the_rfcs_intervals() -> None:
    """Back-off 2s, 4s, 8s, then a DEGRADED probe every 30s."""
    policy = HealthPolicy()
    assert policy.retry_backoff_seconds == (2.0, 4.0, 8.0)
    assert policy.degraded_retry_seconds == 30.0


def test_health_states_have_the_rfcs_values() -> None:
    """MemoryHealth is the RFC's four states with their string values."""
    assert [h.value for h in MemoryHealth] == ["healthy", "retry", "degraded", "recovering"]


@pytest.mark.parametrize(("attempt", "seconds"), [(0, 2.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 8.0), (9, 8.0)])
def test_backoff_of_attempt_n_is_the_nth_interval_and_the_last_repeats(attempt: int, seconds: float) -> None:
    """backoff(n) is retry_backoff_seconds[n-1], clamped at both ends."""
    assert HealthPolicy().backoff(attempt) == seconds


def test_seconds_are_floats_whatever_the_caller_passed() -> None:
    """Equal settings given as ints or floats are equal and encode equally."""
    ints = HealthPolicy(retry_backoff_seconds=(1, 2), degraded_retry_seconds=5, summarize_timeout_seconds=7)
    floats = HealthPolicy(
        retry_backoff_seconds=(1.0, 2.0), degraded_retry_seconds=5.0, summarize_timeout_seconds=7.0
    )
    assert ints == floats
    assert msgspec.msgpack.encode(ints) == msgspec.msgpack.encode(floats)


def test_config_is_encoded_with_every_field_defaults_included() -> None:
    """A later change of a default cannot change how an old session replays."""
    encoded = msgspec.json.decode(msgspec.json.encode(ShortTermMemoryConfig()))
    assert set(encoded) == set(ShortTermMemoryConfig.__struct_fields__)
    assert set(encoded["budget"]) == set(MemoryBudget.__struct_fields__)
    assert set(encoded["health"]) == set(HealthPolicy.__struct_fields__)


@given(full_configs)
def test_every_config_round_trips_through_both_encodings(config: ShortTermMemoryConfig) -> None:
    """A configuration decodes to itself from msgpack and from JSON."""
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(config), type=ShortTermMemoryConfig) == config
    assert msgspec.json.decode(msgspec.json.encode(config), type=ShortTermMemoryConfig) == config


BAD_SETTINGS: list[tuple[Any, dict[str, Any], str]] = [
    (MemoryBudget, {"full_zone_turns": -1}, "budget.full_zone_turns"),
    (MemoryBudget, {"full_zone_turns": True}, "budget.full_zone_turns"),
    (MemoryBudget, {"summary_max_tokens": -1}, "budget.summary_max_tokens"),
    (MemoryBudget, {"total_max_tokens": -5}, "budget.total_max_tokens"),
    (MemoryBudget, {"summary_max_tokens": 11, "total_max_tokens": 10}, "budget.summary_max_tokens"),
    (MemoryBudget, {"overflow_policy": "drop_everything"}, "budget.overflow_policy"),
    (MemoryIsolation, {"tenant_key": ""}, "isolation.tenant_key"),
    (MemoryIsolation, {"user_key": "auth..user_id"}, "isolation.user_key"),
    (MemoryIsolation, {"session_key": "auth."}, "isolation.session_key"),
    (HealthPolicy, {"retry_backoff_seconds": ()}, "health.retry_backoff_seconds"),
    (HealthPolicy, {"retry_backoff_seconds": (2.0, -1.0)}, "health.retry_backoff_seconds[1]"),
    (HealthPolicy, {"retry_backoff_seconds": (float("inf"),)}, "health.retry_backoff_seconds[0]"),
    (HealthPolicy, {"degraded_retry_seconds": -0.5}, "health.degraded_retry_seconds"),
    (HealthPolicy, {"degraded_retry_seconds": float("nan")}, "health.degraded_retry_seconds"),
    (HealthPolicy, {"summarize_timeout_seconds": -1.0}, "health.summarize_timeout_seconds"),
    (HealthPolicy, {"summarize_timeout_seconds": 0}, "health.summarize_timeout_seconds"),
    (HealthPolicy, {"summarize_timeout_seconds": True}, "health.summarize_timeout_seconds"),
    (AgentsMemoryConfig, {"strategy": "forgetting"}, "agents.strategy"),
    (AgentsMemoryConfig, {"max_turns": 0}, "agents.max_turns"),
    (AgentsMemoryConfig, {"keep_last_n_turns": 9}, "agents.keep_last_n_turns"),
    (AgentsMemoryConfig, {"keep_last_n_turns": 8, "max_turns": 10}, "agents.keep_last_n_turns"),
    (AgentsMemoryConfig, {"compact_keep": -1}, "agents.compact_keep"),
    (ConversationMemoryConfig, {"max_messages": 0}, "memories.max_messages"),
    (ConversationMemoryConfig, {"window_size": 0}, "memories.window_size"),
    (ConversationMemoryConfig, {"entity_recent_messages": -1}, "memories.entity_recent_messages"),
    (ShortTermMemoryConfig, {"strategy": "vector"}, "strategy"),
    (ShortTermMemoryConfig, {"recovery_backlog_limit": -1}, "recovery_backlog_limit"),
    (ShortTermMemoryConfig, {"retry_attempts": -1}, "retry_attempts"),
    (
        ShortTermMemoryConfig,
        {"agents": AgentsMemoryConfig(strategy="summarizing")},
        "agents.strategy",
    ),
]


@pytest.mark.parametrize(("cls", "fields", "field"), BAD_SETTINGS, ids=[b[2] for b in BAD_SETTINGS])
def test_a_bad_setting_raises_invalid_config_naming_the_field(
    cls: Any, fields: dict[str, Any], field: str
) -> None:
    """Every out-of-range setting raises InvalidConfig (a ValueError) naming its field."""
    with pytest.raises(InvalidConfig) as info:
        cls(**fields)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")
    assert isinstance(info.value, InvalidInput)
    assert isinstance(info.value, ValueError)


def test_zero_retries_is_allowed() -> None:
    """retry_attempts=0 is valid: the first failure degrades at once."""
    assert ShortTermMemoryConfig(retry_attempts=0).retry_attempts == 0


def test_zero_values_penguiflow_accepts_are_valid() -> None:
    """The zeros PenguiFlow accepts are valid here too, with its meaning (see the projections' tests)."""
    budget = MemoryBudget(full_zone_turns=0, summary_max_tokens=0, total_max_tokens=0)
    assert (budget.full_zone_turns, budget.summary_max_tokens, budget.total_max_tokens) == (0, 0, 0)
    # No overall budget: the summary allowance is not bounded by it.
    assert MemoryBudget(summary_max_tokens=5000, total_max_tokens=0).summary_max_tokens == 5000
    policy = HealthPolicy(retry_backoff_seconds=(0,), degraded_retry_seconds=0)
    assert (policy.retry_backoff_seconds, policy.degraded_retry_seconds) == ((0.0,), 0.0)
    assert ShortTermMemoryConfig(recovery_backlog_limit=0).recovery_backlog_limit == 0


def test_summarizing_agents_strategy_works_with_rolling_summary() -> None:
    """The agents summarizing strategy is valid when the session summarizes."""
    config = ShortTermMemoryConfig(
        strategy="rolling_summary", agents=AgentsMemoryConfig(strategy="summarizing")
    )
    assert config.summarizes


def test_a_bad_config_in_the_log_fails_to_decode_with_its_path() -> None:
    """Settings read from the log are validated like constructed ones, and the path says where."""
    config = msgspec.to_builtins(ShortTermMemoryConfig())
    config["budget"]["full_zone_turns"] = -1
    data = msgspec.msgpack.encode(
        {
            "type": "session.started",
            "seq": 1,
            "event_id": "c/1",
            "at": 1.0,
            "key": {"tenant_id": "t", "user_id": "u", "session_id": "s"},
            "config": config,
        }
    )
    with pytest.raises(EventDecodeError, match=r"budget\.full_zone_turns") as info:
        decode_event(data)
    assert info.value.path == "$.config.budget"


def test_the_system_settings_are_one_value_for_memory_system_and_connect() -> None:
    """`SystemSettings` is what `connect` passes on: one dict works for both, and connect's keywords are
    exactly the backend's, the settings and `config` (nothing restated by hand)."""
    assert ConnectOptions.__optional_keys__ == (
        BackendOptions.__optional_keys__ | SystemSettings.__optional_keys__ | {"config"}
    )
    assert SystemOptions.__optional_keys__ > SystemSettings.__optional_keys__
    settings = SystemSettings(max_live_sessions=3, snapshot_every=7)
    with MemorySystem(log=InMemoryEventLog(), **settings) as system:
        assert system._storage.snapshot_every == 7
    with convmem.connect("memory://", **settings) as system:
        assert system._storage.snapshot_every == 7
    with pytest.raises(UnknownSetting, match="snapshots_every"):
        MemorySystem(log=InMemoryEventLog(), snapshots_every=7)  # type: ignore[call-arg]
