"""The health machine's transitions: what a summarizer's outcome decides.

The health machine (the RFC's, with every interval a setting)::

    HEALTHY --fail--> RETRY(1) --fail--> ... RETRY(n) --fail--> DEGRADED
       ^                 |                                   |  probe every
       |              success                                |  degraded_retry_seconds
       +-----------------+                                   v
       +------ pending drained ------ RECOVERING <--success--+
                                          |--fail--> DEGRADED

Every transition, a failed DEGRADED probe included, is a `HealthChanged`
event, so a replay knows when the next retry is due. Its timing and the
requests a session makes are in `_health`; `decide` calls these for
`SummarySucceeded` and `SummaryFailed`, and the event builders below for the
health changes other commands make (a clear heals a session).
"""

from __future__ import annotations

from typing import assert_never

from convmem.events import AnyEvent, BacklogTrimmed, HealthChanged, MemoryHealth, SummaryProduced
from convmem.projections._budget import TokenEstimator
from convmem.projections._commands import EventIds, SummarySucceeded
from convmem.projections._context import over_budget
from convmem.projections._evolve import evolve
from convmem.projections._health import (
    SURROGATE,
    SummaryRequest,
    is_stale,
    summarizable,
    summary_problem,
    summary_zone,
)
from convmem.projections._state import SessionState

__all__ = ["health_changed", "storable", "summary_failed", "summary_succeeded", "trim_backlog"]


def storable(text: str) -> str:
    """`text` with lone surrogates replaced: reasons come from exception messages."""
    return text.encode("utf-8", "replace").decode("utf-8") if SURROGATE.search(text) else text


def trim_backlog(state: SessionState, ids: EventIds, now: float) -> BacklogTrimmed | None:
    """In DEGRADED, keep at most `recovery_backlog_limit` unsummarized evicted turns."""
    if state.health is not MemoryHealth.DEGRADED or not state.config.summarizes:
        return None
    backlog = state.pending()
    excess = len(backlog) - state.config.recovery_backlog_limit
    if excess <= 0:
        return None
    seq, event_id = ids.next("backlog.trimmed")
    return BacklogTrimmed(
        seq=seq,
        event_id=event_id,
        at=now,
        dropped_through=backlog[excess - 1].index,
        reason=f"backlog over recovery_backlog_limit={state.config.recovery_backlog_limit}",
    )


def health_changed(
    state: SessionState, new: MemoryHealth, reason: str, attempt: int, ids: EventIds, now: float
) -> HealthChanged:
    seq, event_id = ids.next("health.changed")
    return HealthChanged(
        seq=seq,
        event_id=event_id,
        at=now,
        old=state.health,
        new=new,
        reason=storable(reason),
        attempt=attempt,
    )


def summary_succeeded(
    state: SessionState,
    result: SummarySucceeded,
    ids: EventIds,
    now: float,
    estimator: TokenEstimator,
) -> list[AnyEvent]:
    request = result.request
    if is_stale(state, request):
        return []
    problem = summary_problem(result.summary, state.config, estimator)
    if problem is not None:
        return summary_failed(state, request, problem, ids, now)
    mark = ids.mark()
    seq, event_id = ids.next("summary.produced")
    produced = SummaryProduced(
        seq=seq,
        event_id=event_id,
        at=now,
        # summary_max_tokens=0 keeps no summary text; the summary still covers its turns.
        summary=result.summary if state.config.budget.summary_max_tokens else "",
        covers_from=request.covers_from,
        covers_through=request.covers_through,
    )
    events: list[AnyEvent] = [produced]
    after = evolve(state, produced)
    budget = state.config.budget
    if over_budget(after, estimator) is not None:
        ids.reset(mark)
        return summary_failed(
            state,
            request,
            f"summary would put the context over total_max_tokens={budget.total_max_tokens}",
            ids,
            now,
        )
    _, trigger = summary_zone(state.config)
    drained = len(summarizable(after)) < trigger
    match state.health:
        case MemoryHealth.HEALTHY:
            pass
        case MemoryHealth.RETRY:
            events.append(health_changed(after, MemoryHealth.HEALTHY, "summarizer recovered", 0, ids, now))
        case MemoryHealth.DEGRADED:
            recovering = health_changed(
                after, MemoryHealth.RECOVERING, "summarizer answered a recovery probe", 0, ids, now
            )
            events.append(recovering)
            if drained:
                after = evolve(after, recovering)
                events.append(health_changed(after, MemoryHealth.HEALTHY, "backlog summarized", 0, ids, now))
        case MemoryHealth.RECOVERING:
            if drained:
                events.append(health_changed(after, MemoryHealth.HEALTHY, "backlog summarized", 0, ids, now))
        case _:
            assert_never(state.health)
    return events


def summary_failed(
    state: SessionState, request: SummaryRequest, reason: str, ids: EventIds, now: float
) -> list[AnyEvent]:
    if is_stale(state, request) or (request.health, request.attempt) != (state.health, state.attempt):
        return []  # stale, or a late or repeated failure that the health machine already counted
    retries = state.config.retry_attempts
    match state.health:
        case MemoryHealth.HEALTHY:
            if retries >= 1:
                return [health_changed(state, MemoryHealth.RETRY, reason, 1, ids, now)]
            return _degrade(state, reason, ids, now)
        case MemoryHealth.RETRY:
            if state.attempt < retries:
                return [health_changed(state, MemoryHealth.RETRY, reason, state.attempt + 1, ids, now)]
            return _degrade(state, reason, ids, now)
        case MemoryHealth.DEGRADED:
            return [health_changed(state, MemoryHealth.DEGRADED, reason, state.attempt + 1, ids, now)]
        case MemoryHealth.RECOVERING:
            return _degrade(state, reason, ids, now)
        case _:
            assert_never(state.health)


def _degrade(state: SessionState, reason: str, ids: EventIds, now: float) -> list[AnyEvent]:
    degraded = health_changed(state, MemoryHealth.DEGRADED, reason, 1, ids, now)
    events: list[AnyEvent] = [degraded]
    trimmed = trim_backlog(evolve(state, degraded), ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return events
