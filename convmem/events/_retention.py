"""Retention policies: how long a session is kept, and how much of its history.

A `RetentionPolicy` holds up to four limits, each off when left out:

* `idle`: a session with no event for this long is erased (the normal erasure);
* `max_age`: events older than this are dropped by a compaction;
* `max_turns`: only the newest this many turns are kept, older events dropped;
* `max_events`: a log holding more events than this is compacted.

A compaction keeps the summary and the newest turns (see
`convmem.events.HistoryCompacted`). `RetentionPolicies` gives each tenant
its policy, or the default one: a tenant's entry replaces the default as a
whole. Nothing is ever dropped unless a policy says so: the default policy
is empty.

Durations are seconds (a number) or readable text: ``"90d"``, ``"12h"``,
``"1d12h"``, ``"30m"``, ``"45s"``, ``"2w"``; in a mapping (a file), `idle` and
`max_age`, which erase what they pass, must be text with a unit (``idle = 30``
could mean days and would erase sessions idle for 30 seconds). `RetentionPolicies.parse`
checks a mapping from a file (TOML or JSON) and raises `InvalidConfig`
naming the bad key (``retention.tenants.acme.idle``). A duration is at most
a century, `sweep_every` (a wait, as every wait a setting asks for) at most
a day, and a count at most 2**63 - 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from convmem.errors import InvalidConfig

__all__ = ["RetentionPolicies", "RetentionPolicy", "format_duration", "parse_duration"]

_UNITS = {"w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?[wdhms])+")
_MAX_SECONDS = 100 * 365 * 86_400.0  # a century: anything longer is a typo, not a policy
_DEFAULT_SWEEP = 3_600.0
_MAX_SWEEP = 86_400.0  # a wait between two sweeps, as every wait a setting asks for: at most a day
_MAX_COUNT = 2**63 - 1  # the largest whole number the event codec stores


def _shown(value: object) -> str:
    """`value` for an error message, short whatever it is (a 400-digit number, a long text, a deep list)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        sign = "negative " if value < 0 else ""
        return (
            f"a {len(str(abs(value)))}-digit {sign}number"
            if abs(value) < 10**4000
            else f"a huge {sign}number"
        )
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _part(name: object) -> str:
    """A key of a mapping from outside as one part of a dotted path (cut when long)."""
    text = str(name) if isinstance(name, str | int) and not isinstance(name, bool) else _shown(name)
    return text[:40] + ("..." if len(text) > 40 else "")


def parse_duration(value: object, *, field: str) -> float:
    """Seconds from a number or text such as ``"90d"`` or ``"1h30m"``; `InvalidConfig` names `field`."""
    if isinstance(value, bool):
        raise InvalidConfig(field, f"must be a duration such as '90d' or a number of seconds, got {value!r}")
    if isinstance(value, int) and value > _MAX_SECONDS:  # float() of a huge int overflows: said here
        seconds = math.inf
    elif isinstance(value, int) and value <= 0:
        seconds = 0.0
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if not _WHOLE.fullmatch(text):
            raise InvalidConfig(
                field,
                f"{_shown(value)} is not a duration: write a number and a unit (w, d, h, m, s), e.g. '90d'",
            )
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    else:
        raise InvalidConfig(field, f"must be a duration such as '90d', got {type(value).__name__}")
    if math.isnan(seconds) or seconds <= 0 or (seconds == math.inf and isinstance(value, float)):
        raise InvalidConfig(field, f"must be a duration above zero, got {_shown(value)}")
    if seconds > _MAX_SECONDS:
        raise InvalidConfig(field, f"{_shown(value)} is over a century; say what you mean in days ('3650d')")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration for people: ``"90d"``, ``"1d12h"``, ``"45s"``."""
    if seconds < 1:
        return f"{seconds:g}s"
    parts = []
    left = round(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_COUNT:
        raise InvalidConfig(field, f"must be a whole number from 1 to 2**63 - 1, got {_shown(value)}")
    return value


def _sweep_every(value: object, field: str) -> float:
    """Seconds between two sweeps: a duration of at most a day (a sweep enforces the policies: one a
    week would keep an idle session days past its `idle`)."""
    seconds = parse_duration(value, field=field)
    if seconds > _MAX_SWEEP:
        raise InvalidConfig(field, f"{_shown(value)} is over a day: sweep at least daily ('1d', '12h')")
    return seconds


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """One policy; every limit left None is off (see the module docstring). Durations in seconds."""

    idle: float | None = None
    max_age: float | None = None
    max_turns: int | None = None
    max_events: int | None = None

    def __post_init__(self) -> None:
        for name in ("idle", "max_age"):
            value = getattr(self, name)
            if value is not None:
                msgspec.structs.force_setattr(self, name, parse_duration(value, field=name))
        for name in ("max_turns", "max_events"):
            value = getattr(self, name)
            if value is not None:
                _count(value, name)

    @property
    def empty(self) -> bool:
        """Whether the policy keeps everything forever."""
        return self.idle is None and not self.caps

    @property
    def caps(self) -> bool:
        """Whether the policy caps the history (by age, turns or events)."""
        return self.max_age is not None or self.max_turns is not None or self.max_events is not None

    @classmethod
    def parse(cls, data: object, *, where: str = "retention.default") -> RetentionPolicy:
        """A policy from a mapping (``{"idle": "90d", "max_turns": 200}``); errors name the key."""
        if not isinstance(data, Mapping):
            raise InvalidConfig(where, f"must be a table of limits, got {type(data).__name__}")
        known = ("idle", "max_age", "max_turns", "max_events")
        for name in data:
            if name not in known:
                raise InvalidConfig(
                    f"{where}.{_part(name)}", f"is not a retention setting (known: {', '.join(known)})"
                )
        values: dict[str, Any] = {}
        for name in ("idle", "max_age"):
            value = data.get(name)
            if value is None:
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                # Both erase what they pass: `idle = 30` meant as days would erase every session idle
                # for half a minute. In a policy a duration says its unit; in Python, seconds.
                raise InvalidConfig(
                    f"{where}.{name}",
                    f"is the bare number {_shown(value)}: a policy's {name} erases data, so it needs its "
                    f"unit, e.g. '{_shown(value)}d' for days or '{_shown(value)}s' for seconds",
                )
            values[name] = parse_duration(value, field=f"{where}.{name}")
        for name in ("max_turns", "max_events"):
            if data.get(name) is not None:
                values[name] = _count(data[name], f"{where}.{name}")
        return cls(**values)

    def describe(self) -> str:
        """The policy in one line for people (``idle 90d, max_turns 200``; ``keep everything``)."""
        parts = []
        if self.idle is not None:
            parts.append(f"idle {format_duration(self.idle)}")
        if self.max_age is not None:
            parts.append(f"max_age {format_duration(self.max_age)}")
        if self.max_turns is not None:
            parts.append(f"max_turns {self.max_turns}")
        if self.max_events is not None:
            parts.append(f"max_events {self.max_events}")
        return ", ".join(parts) or "keep everything"


_KEEP_ALL = RetentionPolicy()


class RetentionPolicies(msgspec.Struct, frozen=True, kw_only=True):
    """The default policy, each tenant's own (replacing the default whole), and how often to sweep."""

    default: RetentionPolicy = _KEEP_ALL
    tenants: dict[str, RetentionPolicy] = msgspec.field(default_factory=dict)
    sweep_every: float = _DEFAULT_SWEEP
    """Seconds between two sweeps of a running service (``convmem serve``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.default, RetentionPolicy):
            raise InvalidConfig("retention.default", f"must be a RetentionPolicy, got {self.default!r}")
        for tenant, policy in self.tenants.items():
            if not isinstance(tenant, str) or not tenant:
                raise InvalidConfig(
                    "retention.tenants", f"a tenant id must be a non-empty string, got {tenant!r}"
                )
            if not isinstance(policy, RetentionPolicy):
                raise InvalidConfig(
                    f"retention.tenants.{tenant}", f"must be a RetentionPolicy, got {policy!r}"
                )
        msgspec.structs.force_setattr(
            self, "sweep_every", _sweep_every(self.sweep_every, "retention.sweep_every")
        )

    def for_tenant(self, tenant_id: str) -> RetentionPolicy:
        """The policy of `tenant_id`: its own, else the default."""
        return self.tenants.get(tenant_id, self.default)

    @property
    def empty(self) -> bool:
        """Whether no policy drops anything."""
        return self.default.empty and all(p.empty for p in self.tenants.values())

    @classmethod
    def parse(cls, data: object, *, where: str = "retention") -> RetentionPolicies:
        """Policies from a mapping (a TOML or JSON file's), checked; `InvalidConfig` names the bad key.

        ``{"default": {...}, "tenants": {"acme": {...}}, "sweep_every": "1h"}``; a file may also
        hold them under a top-level ``retention`` table.
        """
        if isinstance(data, Mapping) and set(data) == {"retention"}:
            data = data["retention"]
        if not isinstance(data, Mapping):
            raise InvalidConfig(
                where, f"must be a table (default, tenants, sweep_every), got {type(data).__name__}"
            )
        for name in data:
            if name not in ("default", "tenants", "sweep_every"):
                raise InvalidConfig(
                    f"{where}.{_part(name)}",
                    "is not a retention setting (known: default, tenants, sweep_every)",
                )
        default = RetentionPolicy.parse(data.get("default", {}), where=f"{where}.default")
        tenants_raw = data.get("tenants", {})
        if not isinstance(tenants_raw, Mapping):
            raise InvalidConfig(
                f"{where}.tenants", f"must be a table of tenant policies, got {type(tenants_raw).__name__}"
            )
        tenants = {}
        for tenant, policy in tenants_raw.items():
            if not isinstance(tenant, str) or not tenant.strip():
                raise InvalidConfig(
                    f"{where}.tenants", f"a tenant id must be a non-empty string, got {_shown(tenant)}"
                )
            tenants[tenant] = RetentionPolicy.parse(policy, where=f"{where}.tenants.{_part(tenant)}")
        sweep = _sweep_every(data.get("sweep_every", _DEFAULT_SWEEP), f"{where}.sweep_every")
        return cls(default=default, tenants=tenants, sweep_every=sweep)

    def describe(self) -> list[str]:
        """One line per policy, for people."""
        lines = [f"default: {self.default.describe()}"]
        lines += [f"tenant {t}: {p.describe()}" for t, p in sorted(self.tenants.items())]
        return lines
