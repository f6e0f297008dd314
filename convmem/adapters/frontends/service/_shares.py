"""`FairShares`: each tenant's requests in flight bounded, and the service's capacity shared in turn.

A request is admitted into its tenant's queue, or refused at once with
`Busy` when the tenant already has `max_in_flight` requests received and not
answered. Whenever one of the service's `capacity` places frees, the next
tenant in turn that runs fewer than its `max_running` requests starts the
oldest of its own: tenants take turns, so a tenant sending a flood waits
behind its own requests, never in front of another tenant's, and never holds
all of the capacity while another tenant waits.

Requests are weighed by the CPU they cost, not only counted: one process
runs its Python on one interpreter at a time, so a tenant with 8 requests
of 10 ms of CPU running holds 8/9 of it against another tenant's one (that
tenant's p99 rose 12x). `measured` is told each request's CPU seconds (its
worker thread's), and a tenant's estimate is the most expensive of its
recent requests (decaying by `COST_DECAY` a request, so cheap requests
between expensive ones do not hide them); a tenant runs at most
``CPU_SHARE / estimate`` requests at once (at least 1, at most its
``max_running``): beside others, they share the interpreter with one of
its requests instead of eight. A tenant alone (no other tenant's request
for `ALONE_AFTER` seconds) runs up to its ``max_running`` whatever its
requests cost, so a single-tenant deployment keeps its concurrency. Only the
worker thread's CPU is seen: work a request leaves to the loop, the log's
thread or the summarizer's process is not counted.

It lives on the service's event loop (no lock): `admit` and `done` are
called there only.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

from convmem.adapters.frontends.service._quotas import Quotas, TenantLimits
from convmem.errors import Busy, InvalidKey
from convmem.events import decode_token

__all__ = ["ALONE_AFTER", "COST_DECAY", "CPU_SHARE", "OPERATOR", "FairShares", "tenant_name", "tenant_token"]

CPU_SHARE = 0.004
"""CPU seconds a tenant's running requests may cost together (by its estimate) before it waits for
one of them to end: requests of 4 ms or more run one at a time, of 0.5 ms up to 8."""
COST_DECAY = 0.9
"""A tenant's cost estimate is max(this request's CPU seconds, the estimate before times this)."""
_COSTS_KEPT = 4096
"""Tenants whose cost estimates are kept (the least recently measured go first)."""
ALONE_AFTER = 10.0
"""Seconds since another tenant's last request after which a tenant is alone: its requests run up
to its ``max_running`` whatever they cost (there is no one to share the interpreter with)."""

OPERATOR = "$ops"
"""The queue of operator requests (and of subjects that name no tenant): no tenant token has a ``$``."""


def tenant_token(api_prefix: str, subject: str) -> str:
    """The tenant token of a request subject (``{api_prefix}.v1.{tenant}.{op}...``); `OPERATOR` if none."""
    rest = subject[len(api_prefix) + 1 :].split(".", 3)
    return rest[1] if len(rest) >= 3 and rest[0] == "v1" and rest[1] else OPERATOR


def tenant_name(token: str) -> str:
    """The tenant id of `token` (the token itself when it decodes to none)."""
    try:
        return decode_token(token)
    except InvalidKey:
        return token


class _Tenant:
    __slots__ = ("in_flight", "limits", "running", "waiting")

    def __init__(self, limits: TenantLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self.running = 0
        self.waiting: deque[Callable[[], None]] = deque()


class FairShares:
    """Admission and turn-taking of the requests of one service instance (see the module docstring)."""

    def __init__(self, quotas: Quotas, capacity: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # tenant token: its last admission, newest last
        self.capacity = capacity
        self.running = 0
        self.in_flight = 0
        self._tenants: dict[str, _Tenant] = {}  # tenants with requests in flight (none kept past them)
        self._turns: OrderedDict[str, None] = OrderedDict()  # tenants with waiting requests, in turn
        self._idle: list[Callable[[], None]] = []
        self._costs: OrderedDict[str, float] = OrderedDict()  # CPU seconds a request, by tenant token

    def admit(self, token: str, start: Callable[[], None]) -> bool:
        """Queue `start` as a request of `token`'s tenant and start what may start; False (nothing
        queued) when the tenant is at its ``max_in_flight`` (`busy` says so).

        `start` must begin the request without blocking and call `done(token)` once it is answered.
        """
        tenant = self._tenants.get(token)
        if tenant is None:
            tenant = self._tenants[token] = _Tenant(self.quotas.of_token(token))
        if tenant.in_flight >= tenant.limits.max_in_flight:
            return False  # (a tenant kept here has requests in flight: max_in_flight is 1 or more)
        tenant.in_flight += 1
        self.in_flight += 1
        self._seen.pop(token, None)
        self._seen[token] = self._clock()
        if len(self._seen) > _COSTS_KEPT:
            self._seen.popitem(last=False)
        tenant.waiting.append(start)
        self._turns.setdefault(token)
        self._dispatch()
        return True

    def busy(self, token: str) -> Busy:
        """The `Busy` error of `token`'s tenant, refused by `admit` (it is at its ``max_in_flight``)."""
        allowed = self.quotas.of_token(token).max_in_flight
        return Busy(tenant_id=tenant_name(token), allowed=allowed, usage=self.of(token)[0])

    def done(self, token: str) -> None:
        """One started request of `token`'s tenant was answered: its place goes to the next in turn."""
        tenant = self._tenants[token]
        tenant.running -= 1
        tenant.in_flight -= 1
        self.running -= 1
        self.in_flight -= 1
        if tenant.in_flight == 0:
            del self._tenants[token]
        self._dispatch()
        if self.in_flight == 0:
            idle, self._idle = self._idle, []
            for call in idle:
                call()

    def measured(self, token: str, seconds: float) -> None:
        """One request of `token`'s tenant took `seconds` of CPU (call before its `done`)."""
        before = self._costs.pop(token, 0.0)
        self._costs[token] = max(seconds, before * COST_DECAY)
        if len(self._costs) > _COSTS_KEPT:
            self._costs.popitem(last=False)

    def allowed(self, token: str, limits: TenantLimits) -> int:
        """How many requests `token`'s tenant may run at once now: its ``max_running``, fewer when
        its requests are expensive (``CPU_SHARE / estimate``, at least 1)."""
        cost = self._costs.get(token, 0.0)
        if cost * limits.max_running <= CPU_SHARE or self._alone(token):
            return limits.max_running
        return max(1, int(CPU_SHARE / cost))

    def _alone(self, token: str) -> bool:
        """Whether no other tenant made a request in the last `ALONE_AFTER` seconds (operator
        requests do not count): a single-tenant deployment keeps its concurrency."""
        for other in reversed(self._seen):  # newest first: at most `token` and the operator skipped
            if other not in (token, OPERATOR):
                return self._clock() - self._seen[other] > ALONE_AFTER
        return True

    def when_idle(self, call: Callable[[], None]) -> None:
        """Call `call` once no request is in flight (at once if none is)."""
        if self.in_flight == 0:
            call()
        else:
            self._idle.append(call)

    def of(self, token: str) -> tuple[int, int]:
        """(requests in flight, requests running) of `token`'s tenant."""
        tenant = self._tenants.get(token)
        return (0, 0) if tenant is None else (tenant.in_flight, tenant.running)

    def _dispatch(self) -> None:
        while self.running < self.capacity and self._turns:
            for token in self._turns:  # the first tenant in turn that may run one more
                tenant = self._tenants[token]
                if tenant.running < self.allowed(token, tenant.limits):
                    break
            else:
                return  # every waiting tenant runs its most already
            start = tenant.waiting.popleft()
            del self._turns[token]
            if tenant.waiting:
                self._turns[token] = None  # to the back of the line
            tenant.running += 1
            self.running += 1
            start()
