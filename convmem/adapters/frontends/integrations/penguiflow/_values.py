"""PenguiFlow's value types and convmem's, converted field by field.

penguiflow ships no type information, so its objects cross this boundary as
`Any`; penguiflow itself is imported only when first needed, so convmem
imports without it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from functools import cache
from types import ModuleType
from typing import Any

from convmem.errors import InvalidConfig, InvalidKey, InvalidTurn
from convmem.errors import MemoryBudgetExceeded as ConvmemBudgetExceeded
from convmem.events import (
    ConversationTurn,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    MemoryIsolation,
    MemoryKey,
    ShortTermMemoryConfig,
    TrajectoryDigest,
)
from convmem.projections import SessionState, to_dict

__all__ = [
    "CONVMEM_MARK",
    "UNBOUND",
    "budget_exceeded",
    "config_from_penguiflow",
    "convmem_key",
    "digest_of",
    "health_to_penguiflow",
    "key_from_composite",
    "penguiflow_memory",
    "state_to_penguiflow",
    "turn_from_penguiflow",
    "turn_to_penguiflow",
]

INSTALL = "pip install 'convmem[penguiflow]'"

CONVMEM_MARK = "convmem"
"""The entry convmem adds to a memory state it writes: ``{"key": composite, "seq": version}``.
PenguiFlow's `from_dict` ignores it; convmem's `hydrate` knows the log holds that state."""

UNBOUND = "penguiflow:unbound"
"""Tenant and user of the private sessions that hold a memory's turns until it learns its key.
No composite maps to a tenant with a ':' (see `key_from_composite`), so none can collide."""

_OTHER = "penguiflow:composite"
"""Tenant and user of keys whose composite is not ``tenant:user:session``."""


def penguiflow_memory() -> ModuleType:
    """``penguiflow.planner.memory``, or an ImportError naming the extra to install."""
    try:
        return importlib.import_module("penguiflow.planner.memory")
    except ImportError as exc:
        raise ImportError(f"the PenguiFlow integration needs the penguiflow package: {INSTALL}") from exc


@cache
def _budget_exceeded_class() -> type[ConvmemBudgetExceeded]:
    penguiflow = penguiflow_memory().MemoryBudgetExceeded

    class MemoryBudgetExceeded(ConvmemBudgetExceeded, penguiflow):  # type: ignore[misc, valid-type]
        """Both PenguiFlow's `MemoryBudgetExceeded` and convmem's: either ``except`` catches it."""

    MemoryBudgetExceeded.__module__ = "convmem.penguiflow"
    return MemoryBudgetExceeded


def budget_exceeded(error: ConvmemBudgetExceeded) -> ConvmemBudgetExceeded:
    """`error` as the class that is both PenguiFlow's and convmem's `MemoryBudgetExceeded`."""
    return _budget_exceeded_class()(tokens=error.tokens, budget=error.budget)


def health_to_penguiflow(health: MemoryHealth) -> Any:
    """PenguiFlow's `MemoryHealth` member of the same value."""
    return penguiflow_memory().MemoryHealth(health.value)


def turn_from_penguiflow(turn: Any) -> ConversationTurn:
    """Convert PenguiFlow's `ConversationTurn` (a dataclass) to convmem's; a convmem turn passes."""
    if isinstance(turn, ConversationTurn):
        return turn
    try:
        digest = turn.trajectory_digest
        return ConversationTurn(
            user_message=turn.user_message,
            assistant_response=turn.assistant_response,
            trajectory_digest=None
            if digest is None
            else TrajectoryDigest(
                tools_invoked=_tuple_of(digest.tools_invoked, "trajectory_digest.tools_invoked"),
                observations_summary=digest.observations_summary,
                reasoning_summary=digest.reasoning_summary,
                artifacts_refs=_tuple_of(digest.artifacts_refs, "trajectory_digest.artifacts_refs"),
            ),
            artifacts_shown=_dict_of(turn.artifacts_shown, "artifacts_shown"),
            artifacts_hidden_refs=_tuple_of(turn.artifacts_hidden_refs, "artifacts_hidden_refs"),
            ts=turn.ts,
        )
    except AttributeError as exc:
        raise InvalidTurn(
            "turn", f"must be a PenguiFlow or convmem ConversationTurn, got {type(turn).__name__} ({exc})"
        ) from None


def _dict_of(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidTurn(field, f"must be a dict of JSON values, got {type(value).__name__}")
    return dict(value)


def _tuple_of(value: Any, field: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidTurn(field, f"must be a list of strings, got {type(value).__name__}")
    return tuple(value)


def turn_to_penguiflow(turn: ConversationTurn) -> Any:
    """PenguiFlow's `ConversationTurn` for a convmem turn (what PenguiFlow's callbacks receive)."""
    pf = penguiflow_memory()
    digest = turn.trajectory_digest
    return pf.ConversationTurn(
        user_message=turn.user_message,
        assistant_response=turn.assistant_response,
        trajectory_digest=None
        if digest is None
        else pf.TrajectoryDigest(
            tools_invoked=list(digest.tools_invoked),
            observations_summary=digest.observations_summary,
            reasoning_summary=digest.reasoning_summary,
            artifacts_refs=list(digest.artifacts_refs),
        ),
        artifacts_shown=dict(turn.artifacts_shown),
        artifacts_hidden_refs=list(turn.artifacts_hidden_refs),
        ts=turn.ts,
    )


def config_from_penguiflow(config: Any) -> ShortTermMemoryConfig:
    """convmem's configuration for PenguiFlow's `ShortTermMemoryConfig`, zeros with PenguiFlow's meaning.

    Strategy, budget, isolation, summarizer model, digests, backlog limit and
    retries map one to one; PenguiFlow's retry back-off (``base * 2**(n-1)``)
    becomes the interval table, and its DEGRADED interval the probe interval.
    The callables (`token_estimator`, the ``on_*`` callbacks) are not
    configuration: `DefaultShortTermMemory` hands them to its sessions.
    """
    if isinstance(config, ShortTermMemoryConfig):
        return config
    try:
        budget, isolation = config.budget, config.isolation
        base = float(config.retry_backoff_base_s)
        return ShortTermMemoryConfig(
            strategy=config.strategy,
            budget=MemoryBudget(
                full_zone_turns=budget.full_zone_turns,
                summary_max_tokens=budget.summary_max_tokens,
                total_max_tokens=budget.total_max_tokens,
                overflow_policy=budget.overflow_policy,
            ),
            isolation=MemoryIsolation(
                tenant_key=isolation.tenant_key,
                user_key=isolation.user_key,
                session_key=isolation.session_key,
                require_explicit_key=isolation.require_explicit_key,
            ),
            summarizer_model=config.summarizer_model,
            include_trajectory_digest=config.include_trajectory_digest,
            recovery_backlog_limit=config.recovery_backlog_limit,
            retry_attempts=config.retry_attempts,
            health=HealthPolicy(
                retry_backoff_seconds=tuple(base * 2**i for i in range(max(1, config.retry_attempts))),
                degraded_retry_seconds=float(config.degraded_retry_interval_s),
            ),
        )
    except AttributeError as exc:
        raise InvalidConfig(
            "config", f"must be PenguiFlow's ShortTermMemoryConfig, got {type(config).__name__} ({exc})"
        ) from None


def convmem_key(key: Any) -> MemoryKey:
    """A convmem key from convmem's or PenguiFlow's `MemoryKey`."""
    if isinstance(key, MemoryKey):
        return key
    try:
        return MemoryKey(key.tenant_id, key.user_id, key.session_id)
    except AttributeError:
        raise InvalidKey("key", f"must be a MemoryKey, got {type(key).__name__}") from None


def key_from_composite(composite: str) -> MemoryKey:
    """The convmem key of the composite string PenguiFlow names a session by.

    PenguiFlow writes ``f"{tenant}:{user}:{session}"`` without escaping, so
    ids holding ``:`` make it ambiguous (and PenguiFlow itself then gives two
    keys one memory). The rule, deterministic and one-to-one:

    * the tenant is the text before the first ``:``, the session the text
      after the last ``:``, the user everything between (``acme:user:42:chat``
      is tenant ``acme``, user ``user:42``, session ``chat``): user ids are
      the ids that most often hold a colon;
    * a composite that does not give three valid ids that way (fewer than two
      colons, an empty or over-long id) is kept whole as the session id of
      tenant and user ``penguiflow:composite`` (hashed, ``sha256:<hex>``,
      when it is not a valid id itself).
    """
    if not isinstance(composite, str):
        raise InvalidKey("key", f"must be a string, got {type(composite).__name__}")
    tenant, sep, rest = composite.partition(":")
    user, sep2, session = rest.rpartition(":")
    if sep and sep2:
        try:
            return MemoryKey(tenant, user, session)
        except InvalidKey:
            pass
    try:
        return MemoryKey(_OTHER, _OTHER, composite)
    except InvalidKey:
        hashed = hashlib.sha256(composite.encode("utf-8", "replace")).hexdigest()
        return MemoryKey(_OTHER, _OTHER, f"sha256:{hashed}")


def digest_of(state: Mapping[str, Any]) -> str:
    """SHA-256 of a saved memory state's canonical JSON (what an import is recognised by)."""
    text = json.dumps(state, ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def _penguiflow_snapshot(config: Any) -> dict[str, Any]:
    """PenguiFlow's `config_snapshot` of its configuration."""
    budget, isolation = config.budget, config.isolation
    return {
        "strategy": config.strategy,
        "budget": {
            "full_zone_turns": budget.full_zone_turns,
            "summary_max_tokens": budget.summary_max_tokens,
            "total_max_tokens": budget.total_max_tokens,
            "overflow_policy": budget.overflow_policy,
        },
        "isolation": {
            "tenant_key": isolation.tenant_key,
            "user_key": isolation.user_key,
            "session_key": isolation.session_key,
            "require_explicit_key": isolation.require_explicit_key,
        },
        "summarizer_model": config.summarizer_model,
        "include_trajectory_digest": config.include_trajectory_digest,
        "recovery_backlog_limit": config.recovery_backlog_limit,
        "retry_attempts": config.retry_attempts,
    }


def state_to_penguiflow(state: SessionState, penguiflow_config: Any, key: MemoryKey | None) -> dict[str, Any]:
    """PenguiFlow's memory-state dict of `state` (its `from_dict` reads it), marked as convmem's.

    With `key`, the mark names the session and the log position the dict
    was taken at, so that convmem's `hydrate` and `from_dict` know the log
    already holds it.
    """
    exported = to_dict(state)
    if not isinstance(penguiflow_config, ShortTermMemoryConfig):
        exported["config_snapshot"] = _penguiflow_snapshot(penguiflow_config)
    if key is not None:
        exported[CONVMEM_MARK] = {"key": key.composite(), "seq": state.version}
    return exported
