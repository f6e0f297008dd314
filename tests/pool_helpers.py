"""Summary requests and a reply recorder, shared by the summarizer pool's tests."""

from __future__ import annotations

import threading

from runtime_helpers import WAIT, key, turn

from convmem.actors import SummaryOutcome
from convmem.events import MemoryHealth
from convmem.projections import SummaryRequest


def request(n: int) -> SummaryRequest:
    """A request told apart from the others by `n` (its first covered turn)."""
    return SummaryRequest(
        key=key(f"s{n}"),
        previous_summary="",
        covers_from=n,
        covers_through=n,
        turns=(turn(f"turn {n}"),),
        health=MemoryHealth.HEALTHY,
        attempt=0,
    )


class Replies:
    """A reply callback that records every outcome and lets a test wait for them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.outcomes: list[SummaryOutcome] = []

    def __call__(self, outcome: SummaryOutcome) -> None:
        with self._cond:
            self.outcomes.append(outcome)
            self._cond.notify_all()

    def wait(self, n: int) -> list[SummaryOutcome]:
        """The first `n` outcomes, once they arrived."""
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.outcomes) >= n, WAIT), f"{n} replies expected"
            return self.outcomes[:n]

    def of(self, n: int) -> list[SummaryOutcome]:
        """Every outcome delivered for request `n` so far."""
        with self._cond:
            return [o for o in self.outcomes if o.request.covers_from == n]
