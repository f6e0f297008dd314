"""What each tenant may use of a service: requests in flight, requests running, stored bytes.

```toml
[quotas.default]            # every tenant (each key optional: these are the defaults)
max_in_flight = 32          # requests received and not yet answered, per service instance
max_running = 8             # of which at most this many run at once (the rest wait their turn)
max_bytes = "1GiB"          # the tenant's stored events; "unlimited" for none

[quotas.tenants.acme]       # one tenant's own limits (keys not given come from [quotas.default])
max_bytes = "10GiB"
```

`Quotas.from_mapping` reads that table from a configuration file: anything
hostile or mistyped is an `InvalidConfig` naming the key
(``quotas.tenants.acme.max_bytes``), never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from convmem.errors import InvalidConfig, InvalidKey
from convmem.events import MemoryKey, encode_token

__all__ = ["DEFAULT_LIMITS", "Quotas", "TenantLimits", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d{1,15})\s*([a-zA-Z]{0,3})\s*$")
_MAX_COUNT = 1_000_000
_MAX_BYTES = 1 << 60


def parse_bytes(value: object, where: str) -> int | None:
    """A byte count from a whole number or a string such as ``"512MiB"``; None for ``"unlimited"``."""
    if isinstance(value, str):
        if value.strip().lower() == "unlimited":
            return None
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise InvalidConfig(
                where,
                f"{value[:40]!r} is not a size: give bytes (1048576), a size with a unit "
                '(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB: "512MiB") or "unlimited"',
            )
        value = int(match.group(1)) * _UNITS[unit]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfig(
            where, f"must be a whole number of bytes or a size string, got {type(value).__name__}"
        )
    if not 1 <= value <= _MAX_BYTES:
        raise InvalidConfig(where, f"must be between 1 and 2**60 bytes, got {value}")
    return value


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfig(where, f"must be a whole number, got {type(value).__name__}")
    if not 1 <= value <= _MAX_COUNT:
        raise InvalidConfig(where, f"must be between 1 and {_MAX_COUNT:,}, got {value}")
    return value


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's limits in a service instance.

    `max_in_flight` bounds its requests received and not yet answered (past
    it: `Busy` at once); `max_running` how many of them run at once, so one
    tenant never takes all of the service's `max_concurrency`; `max_bytes`
    bounds its stored events (past it writes are refused with
    `QuotaExceeded`; None: no bound).
    """

    max_in_flight: int = 32
    max_running: int = 8
    max_bytes: int | None = 1 << 30

    def __post_init__(self) -> None:
        self.check("quotas")

    def check(self, where: str) -> None:
        """Raise `InvalidConfig` naming ``{where}.<key>`` for a limit out of range."""
        _count(self.max_in_flight, f"{where}.max_in_flight")
        _count(self.max_running, f"{where}.max_running")
        if self.max_bytes is not None:
            parse_bytes(self.max_bytes, f"{where}.max_bytes")
        if self.max_running > self.max_in_flight:
            raise InvalidConfig(
                f"{where}.max_running",
                f"is {self.max_running}, over max_in_flight ({self.max_in_flight}): "
                "running requests are in flight too",
            )

    @classmethod
    def from_mapping(cls, data: object, where: str, base: TenantLimits | None = None) -> TenantLimits:
        """The limits in a configuration table; keys it does not give come from `base`."""
        if not isinstance(data, Mapping):
            raise InvalidConfig(where, f"must be a table of limits, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise InvalidConfig(
                    f"{where}.{str(key)[:40]}", f"is not a limit; the limits are {', '.join(sorted(known))}"
                )
        base = base or DEFAULT_LIMITS
        values: dict[str, Any] = {
            "max_in_flight": _count(data.get("max_in_flight", base.max_in_flight), f"{where}.max_in_flight"),
            "max_running": _count(data.get("max_running", base.max_running), f"{where}.max_running"),
            "max_bytes": parse_bytes(data["max_bytes"], f"{where}.max_bytes")
            if "max_bytes" in data
            else base.max_bytes,
        }
        limits = cls.__new__(cls)
        for name, value in values.items():
            object.__setattr__(limits, name, value)
        limits.check(where)
        return limits


DEFAULT_LIMITS = TenantLimits()


@dataclass(frozen=True)
class Quotas:
    """Every tenant's limits: `default`, and `tenants` (by tenant id) for those with their own.

    `recount_every` is how many seconds a service instance trusts its tally of
    a tenant's stored bytes before it counts them in the log again (see
    `TenantUsage`).
    """

    default: TenantLimits = DEFAULT_LIMITS
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    recount_every: float = 5.0
    _by_token: dict[str, TenantLimits] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.default, TenantLimits):
            raise InvalidConfig("quotas.default", f"must be TenantLimits, got {type(self.default).__name__}")
        if isinstance(self.recount_every, bool) or not isinstance(self.recount_every, int | float):
            raise InvalidConfig("quotas.recount_every", "must be a number of seconds")
        if not 0.1 <= self.recount_every <= 3600:
            raise InvalidConfig(
                "quotas.recount_every", f"must be between 0.1 and 3600 seconds, got {self.recount_every}"
            )
        by_token: dict[str, TenantLimits] = {}
        for tenant_id, limits in self.tenants.items():
            where = f"quotas.tenants.{str(tenant_id)[:40]}"
            if not isinstance(tenant_id, str):
                raise InvalidConfig(where, "a tenant id must be a string")
            try:
                MemoryKey(tenant_id, "_", "_")
            except InvalidKey as exc:
                raise InvalidConfig(where, f"is not a tenant id: {exc.problem}") from None
            if not isinstance(limits, TenantLimits):
                raise InvalidConfig(where, f"must be TenantLimits, got {type(limits).__name__}")
            by_token[encode_token(tenant_id)] = limits
        object.__setattr__(self, "_by_token", by_token)

    def of_token(self, token: str) -> TenantLimits:
        """The limits of the tenant whose subject token is `token`."""
        return self._by_token.get(token, self.default)

    @classmethod
    def from_mapping(cls, data: object, where: str = "quotas") -> Quotas:
        """The quotas of a configuration table (see the module docstring); `InvalidConfig` names the key."""
        if not isinstance(data, Mapping):
            raise InvalidConfig(where, f"must be a table, got {type(data).__name__}")
        allowed = ("default", "tenants", "recount_every")
        for key in data:
            if key not in allowed:
                raise InvalidConfig(
                    f"{where}.{str(key)[:40]}", f"is not a quotas setting; they are {', '.join(allowed)}"
                )
        default = TenantLimits.from_mapping(data.get("default", {}), f"{where}.default")
        tenants_data = data.get("tenants", {})
        if not isinstance(tenants_data, Mapping):
            raise InvalidConfig(
                f"{where}.tenants", f"must be a table of tenants, got {type(tenants_data).__name__}"
            )
        tenants = {
            tenant: TenantLimits.from_mapping(limits, f"{where}.tenants.{str(tenant)[:40]}", default)
            for tenant, limits in tenants_data.items()
        }
        recount = data.get("recount_every", 5.0)
        try:
            return cls(default=default, tenants=tenants, recount_every=recount)
        except InvalidConfig as exc:
            raise InvalidConfig(exc.field.replace("quotas", where, 1), exc.problem) from None
