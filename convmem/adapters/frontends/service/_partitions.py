"""Partitions of the session space, shared by the service workers that know one another through NATS.

A service started with `partitioned=True` (each `convmem serve --workers`
process is one) takes part in a membership: every `beat` seconds it publishes
its instance id on ``{api_prefix}.ctl.members``, and it counts as a member
every worker of its queue group heard within `expiry` seconds (a worker
that stops says so, and is dropped at once).

Only the service may announce: each announcement carries an HMAC-SHA256 of
its body under the `secret` the workers share (`convmem serve` draws one per
run and hands it to its workers; ``CONVMEM_MEMBERS_SECRET`` gives the
processes of several machines the same one), and an announcement without
the right one is dropped (counted in `rejected`, logged at the 1st, 2nd, 4th,
... one). Each announcement also carries its sender's wall-clock time: one
no later than the last heard from that worker, or older than `REPLAY_WINDOW`
seconds, is a replay and is dropped too (the workers' clocks must agree within
that). At most `max_members` other workers are counted; more are ignored.
The shipped NATS configuration also lets only the service's identity publish
or subscribe on ``{api_prefix}.ctl.>`` (operators read status under
``{api_prefix}.ops``, which is not it): a flood of made-up announcements,
from whoever can reach the subject, changes no owner. The `SLOTS` partitions are dealt
over the members in the order of their ids (`owners`), so every member that
heard the same members computes the same owners, on one machine or across a
NATS cluster; a member subscribes to the partitions it owns
(``{api_prefix}.v1.*.*.p{N}``, in the queue group) and drains those it
no longer owns.

While members disagree (one joined or died a moment ago) a partition may
have two owners, each answering part of its requests: optimistic
concurrency on the log keeps the session correct. A partition may also have
none for a moment: the clients then send the request on the plain subject,
which any worker answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from convmem.adapters.frontends.service._protocol import SLOTS, partition_subject
from convmem.errors import InvalidConfig

__all__ = ["MAX_MEMBERS", "REPLAY_WINDOW", "Partitions", "members_subject", "owners", "signed", "verified"]

MAX_MEMBERS = 256
"""Other workers a worker counts at most (each with the shared secret)."""
REPLAY_WINDOW = 60.0
"""Seconds an announcement stays good: an older one (by its sender's clock) is a replay."""


def members_subject(api_prefix: str) -> str:
    """Where the workers announce themselves: a control subject only the service's identity may use."""
    return f"{api_prefix}.ctl.members"


def signed(secret: bytes, body: dict[str, Any]) -> bytes:
    """An announcement: the HMAC-SHA256 of the JSON `body` under `secret` (hex), a space, the body."""
    data = json.dumps(body, sort_keys=True).encode()
    return hmac.new(secret, data, hashlib.sha256).hexdigest().encode() + b" " + data


def verified(secret: bytes, payload: bytes) -> dict[str, Any] | None:
    """The body of an announcement signed with `secret`; None when it is not one."""
    mac, _, data = payload.partition(b" ")
    if not hmac.compare_digest(mac, hmac.new(secret, data, hashlib.sha256).hexdigest().encode()):
        return None
    try:
        said = json.loads(data)
    except ValueError:
        return None
    return said if isinstance(said, dict) else None


_log = logging.getLogger("convmem.service")


def owners(members: Iterable[str], slots: int = SLOTS) -> dict[int, str]:
    """The owner of each partition: partition N goes to the (N mod count)-th member in id order."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    return {slot: ordered[slot % len(ordered)] for slot in range(slots)}


class Partitions:
    """One worker's share of the partitions (see the module docstring); runs on the service's loop."""

    def __init__(
        self,
        nc: Client,
        *,
        api_prefix: str,
        queue_group: str,
        instance: str,
        subscribe: Callable[[str, str], Awaitable[Subscription]],
        secret: bytes,
        beat: float = 0.5,
        expiry: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        max_members: int = MAX_MEMBERS,
        wall: Callable[[], float] = time.time,
        on_rejected: Callable[[], None] | None = None,
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise InvalidConfig(
                "members_secret", "partitioned workers need a shared secret of at least 16 bytes"
            )
        self.nc = nc
        self.api_prefix = api_prefix
        self.queue_group = queue_group
        self.instance = instance
        self.beat = beat
        self.expiry = expiry
        self.changes = 0
        """How many times this worker's share changed (the first deal counts)."""
        self.beats = 0
        """How many times this worker announced itself."""
        self.rejected = 0
        """Announcements dropped: not signed with the workers' secret, not one, or past `max_members`."""
        self.max_members = max_members
        self._secret = secret
        self._clock = clock
        self._subscribe = subscribe  # (subject, queue group): a partition's requests, to the service
        self._on_rejected = on_rejected  # told after each dropped announcement is counted
        self._seen: dict[str, float] = {}
        self._wall = wall
        self._said_at: dict[str, float] = {}  # the latest announcement's time, by worker
        self._subs: dict[int, Subscription] = {}
        self._members_sub: Subscription | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._draining: set[asyncio.Task[None]] = set()
        self._dealing = asyncio.Lock()
        self._left = False

    @property
    def subject(self) -> str:
        return members_subject(self.api_prefix)

    @property
    def members(self) -> list[str]:
        """The workers this one counts as alive, itself included, in id order."""
        now = self._clock()
        return sorted({self.instance, *(i for i, at in self._seen.items() if now - at <= self.expiry)})

    @property
    def owned(self) -> list[int]:
        """The partitions this worker subscribes to now."""
        return sorted(self._subs)

    async def start(self) -> None:
        """Join: say so, hear the members for a beat and a half, take this worker's share, keep beating."""
        self._members_sub = await self.nc.subscribe(self.subject, cb=self._on_member)
        await self._say(leaving=False)
        await asyncio.sleep(self.beat * 1.5)  # every running member beats within this window
        await self._deal()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def leave(self) -> list[Subscription]:
        """Stop beating and tell the others, who take over at once; returns the subscriptions to drain."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        with contextlib.suppress(nats.errors.Error):
            await self._say(leaving=True)
        async with self._dealing:  # a deal under way (another member joined or left) ends first
            self._left = True  # and none after: a leaving worker takes no partition again
            subs = list(self._subs.values())
            self._subs.clear()
        if self._members_sub is not None:
            subs.append(self._members_sub)
        if self._draining:
            await asyncio.wait(set(self._draining), timeout=self.expiry * 2)
        return subs

    async def _say(self, *, leaving: bool) -> None:
        body = {
            "instance": self.instance,
            "queue_group": self.queue_group,
            "leaving": leaving,
            "at": self._wall(),
        }
        await self.nc.publish(self.subject, signed(self._secret, body))
        self.beats += 1

    def _reject(self, why: str) -> None:
        self.rejected += 1
        if self._on_rejected is not None:
            self._on_rejected()
        if self.rejected & (self.rejected - 1) == 0:
            _log.warning(
                "convmem service %s: dropped a member announcement on %s (%s); %d dropped so far",
                self.instance,
                self.subject,
                why,
                self.rejected,
            )

    async def _on_member(self, msg: Msg) -> None:
        said = verified(self._secret, msg.data)
        if said is None:
            self._reject("not signed with the workers' secret")
            return
        instance, group, leaving = said.get("instance"), said.get("queue_group"), said.get("leaving")
        if not isinstance(instance, str) or not isinstance(leaving, bool) or len(instance) > 200:
            self._reject("not an announcement")
            return
        if group != self.queue_group or instance == self.instance:
            return
        at = said.get("at")
        if not isinstance(at, int | float) or isinstance(at, bool):
            self._reject("not an announcement")
            return
        if at <= self._said_at.get(instance, self._wall() - REPLAY_WINDOW):
            self._reject("a replay: no later than the last one heard, or too old")
            return
        known = instance in self.members
        if leaving:
            self._seen.pop(instance, None)
        elif instance in self._seen or self._forget_expired() < self.max_members:
            self._seen[instance] = self._clock()
        else:
            self._reject(f"over {self.max_members} members")
            return
        if not leaving or known:
            self._said_at[instance] = at
        if known == leaving and self._ticker is not None:  # joined or left: deal again now
            await self._deal()

    def _forget_expired(self) -> int:
        """Drop the workers not heard within `expiry`; how many others are left."""
        now = self._clock()
        for instance in [i for i, at in self._seen.items() if now - at > self.expiry]:
            del self._seen[instance]
        oldest = self._wall() - REPLAY_WINDOW  # older announcements are refused anyway
        for instance in [i for i, at in self._said_at.items() if at < oldest]:
            del self._said_at[instance]
        return len(self._seen)

    async def _tick(self) -> None:
        while True:
            due = self._clock() + self.beat
            await asyncio.sleep(self.beat)
            stalled = self._clock() - due > self.beat  # this loop was held up: the others' beats may
            try:  # be waiting unread, so nobody is dropped on this tick
                await self._say(leaving=False)
                if not stalled:
                    await self._deal()  # drops the members not heard within `expiry`
            except Exception as exc:  # reconnecting, say: the next beat tries again
                _log.warning("convmem service: membership beat failed: %s", exc)

    async def _deal(self) -> None:
        async with self._dealing:
            await self._deal_now()

    async def _deal_now(self) -> None:
        if self._left:
            return
        mine = {slot for slot, owner in owners(self.members).items() if owner == self.instance}
        gained, lost = mine - self._subs.keys(), self._subs.keys() - mine
        if not gained and not lost:
            return
        for slot in sorted(gained):  # take the new ones before letting the old ones go
            self._subs[slot] = await self._subscribe(
                partition_subject(self.api_prefix, slot), self.queue_group
            )
        for slot in lost:
            task = asyncio.get_running_loop().create_task(self._drain(self._subs.pop(slot)))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
        self.changes += 1
        _log.info(
            "convmem service %s: %d members, owns %d of %d partitions",
            self.instance,
            len(self.members),
            len(mine),
            SLOTS,
        )

    @staticmethod
    async def _drain(sub: Subscription) -> None:
        with contextlib.suppress(nats.errors.Error):
            await sub.drain()  # type: ignore[no-untyped-call]  # the requests already received are answered
