"""10. Peers: convmem beside the memories a planner would pick instead, on one workload, in one run.

The workload of issue 14: N sessions (1,000, then 10,000) that each receive
`peer_turns` (20) turns from `peer_callers` (64) callers; caller ``c`` owns
sessions ``c, c + 64, c + 128, ...`` and goes round them one turn at a time,
so consecutive turns land in different sessions (a planner service with N
open chats). A write is one finished turn (the user's message and the
assistant's answer, about 150 + 380 characters); a read is what each store
offers as the context to inject, through its own API:

* convmem: `SessionHandle.add_turn` / `get_llm_context` from threads on
  `convmem.connect()` (the embedded server, ``sync_interval: always``: the
  server fsyncs before it acknowledges), once with every session live (a
  live bound above N, no idle passivation) and once with the live bound and
  idle time `connect()` gives by default; and `AsyncSessionHandle` from
  asyncio tasks on `convmem.connect_here()` with the server's default flush
  (acknowledged before the disk), every session live. Strategy
  ``truncation``: a read shows the newest 5 turns.
* OpenAI Agents `SQLiteSession`: `add_items` of the turn's two items (one
  commit) and `get_items` (every item of the session), from asyncio tasks as
  the SDK runs it (each call in a worker thread). On a file (WAL, SQLite's
  default ``synchronous=FULL``: the log is fsynced at every commit), with at
  most `AGENTS_OPEN_SESSIONS` session objects open (each holds a connection
  per worker thread; the others are made again on demand), and in memory
  (``:memory:``, one database per session object, not durable).
* LangGraph checkpointers holding a thread's ``messages`` channel, from
  threads: a write reads the thread's latest checkpoint and puts the next one
  with the turn's two messages appended (what `update_state` stores, without
  the graph's own work); a read is the latest checkpoint's messages
  (`get_tuple`). `SqliteSaver` on a file (WAL, ``synchronous=FULL``, one
  connection behind the saver's lock) and `InMemorySaver` (not durable).
* PenguiFlow's `DefaultShortTermMemory`, one per session in the process
  (not durable), from asyncio tasks: `add_turn` / `get_llm_context`, strategy
  ``truncation`` with its default 5-turn window, as convmem's.

Every store runs in a child process of its own (no store pays for another's
threads, heap or registries), is opened before the timed part and stays open
through the size's rounds.
Each session first gets its first ``peer_turns - peer_rounds * k`` turns
(not timed: it creates the session everywhere); then `peer_rounds` (3) write
rounds each add ``k`` more turns to every session (turns 3-8, 9-14, 15-20:
the history grows, and so does what a store that rewrites or replays it
pays), then 3 read rounds of `peer_read_seconds` (4 s) each, every caller
going round its sessions for that long (the sessions hold all 20 turns).
Every round runs the stores one after the other in an order that turns by
one store each round, so a busy moment of the machine falls on all of them.
A figure is the median of its 3 rounds (each round's rate is in the
details). Afterwards each store must show, for a few sessions, exactly the
turns written (its newest 5, or all of them): a store that lost or
reordered a turn fails the measure.

With connect()'s default live bound (256 sessions) the sessions past it lose
their actor: at 1,000 or 10,000 sessions round-robin nearly every write
starts one session's actor and stops another's. Their state and view stay in
the idle cache (512 MiB by default), so reads need no actor and a write's
activation reads no log. The issue's targets are about that case at the
largest size: writes at least 0.8 and reads at least 0.5 of the same store
with every session live, and both ahead of the two SQLite peers. When they
are missed, the full run profiles an extra pass of that store (py-spy, when
installed). With ``CONVMEM_BENCH_BASELINE`` naming another checkout (the code
before a change), that checkout's default-bound store runs in the same
rounds, and the default bound is compared with it.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, TypeVar

from bench._common import Figure, Result, Sizes, Target
from bench._peer_runs import STORES, StoreProcess
from bench._peer_stores import AGENTS_OPEN_SESSIONS

__all__ = ["BASELINE_ENV", "run"]

BASELINE_ENV = "CONVMEM_BENCH_BASELINE"
"""A checkout (`git worktree add --detach ../base main`) whose default-bound store runs beside the rest."""

T = TypeVar("T")
_SHORT = {
    "agents_file": "Agents SQLiteSession on a file",
    "langgraph_file": "LangGraph SqliteSaver on a file",
}


def _turn_order(stores: list[T], round_: int) -> list[T]:
    """The stores in the order of round `round_`: the list turned by one each round."""
    shift = round_ % len(stores)
    return stores[shift:] + stores[:shift]


def _one_size(sizes: Sizes, sessions: int, processes: dict[str, StoreProcess], result: Result) -> None:
    """Every store on `sessions` sessions: median writes/s and reads/s as figures, rounds in the details."""
    per_round = sizes.peer_turns // sizes.peer_rounds
    first_turns = sizes.peer_turns - per_round * sizes.peer_rounds
    order = list(processes.values())
    detail: dict[str, Any] = {"callers": min(sizes.peer_callers, sessions), "stores": {}}
    writes: dict[str, list[float]] = {name: [] for name in processes}
    reads: dict[str, list[float]] = {name: [] for name in processes}
    opened: list[StoreProcess] = []
    try:
        for store in order:
            detail["stores"][store.label] = store.open(sessions)
            opened.append(store)
        first = {store.name: store.writes(0, first_turns) for store in order}
        for round_ in range(sizes.peer_rounds):
            done = first_turns + round_ * per_round
            for store in _turn_order(order, round_):
                writes[store.name].append(store.writes(done, done + per_round))
        for round_ in range(sizes.peer_rounds):
            for store in _turn_order(order, round_):
                reads[store.name].append(store.reads(sizes.peer_read_seconds))
        for store in order:
            detail["stores"][store.label] |= {
                "writes_per_s_rounds": writes[store.name],
                "reads_per_s_rounds": reads[store.name],
                "first_turns_per_s": first[store.name],
                "turns_a_read_shows": store.check(),
            }
        got = {
            name: {"writes": statistics.median(writes[name]), "reads": statistics.median(reads[name])}
            for name in processes
        }
        missed = got["bound"]["writes"] < 0.8 * got["live"]["writes"]
        if sessions == max(sizes.peer_sessions) and missed and sizes.profile:
            name = f"peers-default-bound-{sessions}"
            result.details[name] = processes["bound"].profile(sizes.out_dir, name, sizes.peer_read_seconds)
    finally:
        for store in opened:
            store.close()
    result.details[f"{sessions}_sessions"] = detail
    _figures(sizes, sessions, got, {name: store.label for name, store in processes.items()}, result)


def _figures(
    sizes: Sizes, sessions: int, got: dict[str, dict[str, float]], labels: dict[str, str], result: Result
) -> None:
    targets = sessions == max(sizes.peer_sessions)
    for what, share in (("writes", 0.8), ("reads", 0.5)):
        for key, label in labels.items():
            reference = got["live"][what] if key == "bound" else None
            result.add(
                Figure(
                    f"{what}/s @ {sessions:,} sessions, {label}",
                    got[key][what],
                    f"{what}/s",
                    reference=reference,
                    reference_label=f"{labels['live']} (median {what}/s)" if reference is not None else "",
                    target=Target("ratio", ">=", share) if reference is not None and targets else None,
                )
            )
        if "baseline" in got:
            result.add(
                Figure(
                    f"{what}/s @ {sessions:,} sessions, convmem, default live bound, vs the baseline",
                    got["bound"][what],
                    f"{what}/s",
                    reference=got["baseline"][what],
                    reference_label=labels["baseline"],
                )
            )
        for peer in ("agents_file", "langgraph_file"):
            result.add(
                Figure(
                    f"{what}/s @ {sessions:,} sessions, convmem, default live bound, vs {_SHORT[peer]}",
                    got["bound"][what],
                    f"{what}/s",
                    reference=got[peer][what],
                    reference_label=labels[peer],
                    target=Target("ratio", ">=", 1.0) if targets else None,
                )
            )


SESSIONS_ENV = "CONVMEM_BENCH_PEER_SESSIONS"
"""Comma-separated session counts to run instead of the sizes' (``10000``: only the largest, ~15 min)."""


def _sizes(sizes: Sizes) -> tuple[int, ...]:
    chosen = os.environ.get(SESSIONS_ENV, "").strip()
    if not chosen:
        return sizes.peer_sessions
    try:
        counts = tuple(int(c) for c in chosen.split(","))
    except ValueError:
        raise RuntimeError(f"{SESSIONS_ENV}={chosen!r}: expected session counts such as 1000,10000") from None
    if any(c < sizes.peer_callers for c in counts):
        raise RuntimeError(
            f"{SESSIONS_ENV}={chosen!r}: every count must be at least the {sizes.peer_callers} callers"
        )
    return counts


def run(sizes: Sizes) -> Result:
    result = Result()
    processes: dict[str, StoreProcess] = {}
    try:
        for name in STORES:
            processes[name] = StoreProcess(name, turns=sizes.peer_turns, callers=sizes.peer_callers)
        baseline = os.environ.get(BASELINE_ENV)
        if baseline:  # the default bound on another checkout (the code before a change), same rounds
            processes["baseline"] = StoreProcess(
                "bound", turns=sizes.peer_turns, callers=sizes.peer_callers, root=baseline, key="baseline"
            )
        for sessions in _sizes(sizes):
            _one_size(sizes, sessions, processes, result)
    finally:
        for process in processes.values():
            process.exit()
    per_round = sizes.peer_turns // sizes.peer_rounds
    result.notes += [
        f"{sizes.peer_callers} callers, each round its own sessions; {sizes.peer_turns} turns a session "
        f"({sizes.peer_turns - per_round * sizes.peer_rounds} first, not timed, then {sizes.peer_rounds} "
        f"write rounds of {per_round}), then {sizes.peer_rounds} read rounds of "
        f"{sizes.peer_read_seconds:g} s "
        "each; "
        "rounds alternate between the stores; each figure is the median of its rounds",
        "durable: convmem threads (the embedded server fsyncs before it acknowledges), the two SQLite "
        "files (WAL, synchronous FULL: fsync per commit); convmem tasks: acknowledged by the server "
        "before its default flush; not durable: SQLiteSession :memory:, InMemorySaver, PenguiFlow",
        "the work differs: a convmem or PenguiFlow read is the context of the newest 5 turns; an Agents or "
        f"LangGraph read returns every item of the session ({2 * sizes.peer_turns} messages at the end); "
        "a LangGraph write stores the whole message list again in a new checkpoint",
        f"Agents SQLiteSession on a file: at most {AGENTS_OPEN_SESSIONS:,} session objects open at once "
        "(least recently used closed), since each holds a connection per worker thread",
        "targets (issue 14, at the largest size): with connect()'s default live bound, writes >= 0.8 and "
        "reads >= 0.5 of every session live, and ahead of both SQLite peers",
    ]
    return result
