"""`convmem demo`: convmem's main job, end to end, on one machine.

It starts the embedded default (a private nats-server with JetStream),
plays real human conversations (the chitchat dataset) through many
concurrent planner sessions with rolling summaries, shows one session's
context and health history, then acts as an auditor: replays every session
from the log alone and checks that it rebuilds to the live state.

One session's summarizer is made to fail twice, so the health history shows
the machine at work (HEALTHY -> RETRY -> ... -> HEALTHY) without waiting long.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import timeline, verify
from convmem.actors._bounds import MAX_ACTOR_THREADS
from convmem.adapters._auth import redact_url
from convmem.adapters.backends.summarizers import ExtractiveSummarizer, ProcessSummarizer, recommended
from convmem.adapters.frontends._connect import connect
from convmem.adapters.frontends.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    CliError,
    Progress,
    bounded_int,
    emit_json,
    positive_int,
    session_counts,
    table,
)
from convmem.adapters.frontends.cli._readable import readable
from convmem.events import (
    ConversationTurn,
    HealthPolicy,
    MemoryKey,
    ShortTermMemoryConfig,
)

__all__ = ["add_demo_command", "load_conversations"]

TENANT = "demo"
DEMO_TOTAL_TOKENS = 1000
"""The context budget the demo's planners work with (`recommended`); small, so summaries show early."""


def add_demo_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `demo` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser(
        "demo",
        parents=[common],
        help="play real conversations through convmem, then audit them (the main job)",
    )
    p.add_argument("--sessions", type=positive_int, default=40, help="conversations to play (default 40)")
    p.add_argument(
        "--max-turns",
        type=_max_turns,
        default=30,
        help="turns per conversation at most, 2 or more (default 30)",
    )
    p.add_argument(
        "--planners",
        type=bounded_int(MAX_ACTOR_THREADS),
        default=8,
        help="concurrent planner threads (default 8, at most 4096)",
    )
    p.add_argument("--seed", type=int, default=7, help="which conversations to pick (default 7)")
    p.add_argument("--keep", action="store_true", help="keep the demo's data folder (printed at the end)")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.set_defaults(run=cmd_demo)


def _max_turns(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r} must be 2 or more (a summary needs turns to cover)")
    return value


def load_conversations(count: int, max_turns: int, seed: int) -> list[list[ConversationTurn]]:
    """`count` chitchat conversations as turn pairs (first speaker as user, second as assistant).

    Each has at least 8 turns (or `max_turns`, when fewer are asked for), at most `max_turns`.
    """
    try:
        import chitchat_dataset  # type: ignore[import-untyped]  # noqa: PLC0415 - optional extra, loaded on use
    except ImportError:
        raise CliError(
            "the demo plays the chitchat dataset: install it with  pip install 'convmem[demo]'"
        ) from None
    # Read the package's file ourselves: its Dataset class leaves the file open.
    with (Path(chitchat_dataset.__file__).parent / "dataset.json").open(encoding="utf-8") as handle:
        data: Mapping[str, Any] = json.load(handle)
    ids = sorted(data)
    random.Random(seed).shuffle(ids)
    conversations = []
    shortest = min(8, max_turns)
    for conversation_id in ids:
        turns = _turns(data[conversation_id]["messages"], max_turns)
        if len(turns) >= shortest:
            conversations.append(turns)
        if len(conversations) == count:
            break
    return conversations


def _turns(messages: list[list[Mapping[str, Any]]], max_turns: int) -> list[ConversationTurn]:
    """Consecutive messages of the two speakers, paired into turns."""
    turns = []
    for i in range(0, len(messages) - 1, 2):
        user, assistant = messages[i], messages[i + 1]
        text_user = " ".join(u["text"] for u in user).strip()
        text_assistant = " ".join(u["text"] for u in assistant).strip()
        if not text_user and not text_assistant:
            continue
        stamp = assistant[-1].get("timestamp", "")
        try:
            ts = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            ts = 0.0
        turns.append(ConversationTurn(user_message=text_user, assistant_response=text_assistant, ts=ts))
        if len(turns) == max_turns:
            break
    return turns


class _FlakySummarizer:
    """The extractive summarizer, failing the first two calls for one chosen session."""

    def __init__(self, inner: ExtractiveSummarizer | ProcessSummarizer, flaky_user_text: str) -> None:
        self._inner = inner
        self._flaky = flaky_user_text
        self._failures = 0
        self._lock = threading.Lock()

    def __call__(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        turns = request.get("turns", [])
        if turns and any(t.get("user") == self._flaky for t in turns):
            with self._lock:
                if self._failures < 2:
                    self._failures += 1
                    raise ConnectionError("summarizer endpoint unreachable (injected by the demo)")
        return self._inner(request)


def cmd_demo(args: argparse.Namespace) -> int:
    conversations = load_conversations(args.sessions, args.max_turns, args.seed)
    if not conversations:
        raise CliError(f"no conversation of the dataset has {min(8, args.max_turns)} turns", 2)
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="convmem-demo-"))
    setup = recommended(total_tokens=DEMO_TOTAL_TOKENS)
    # Short health timers, so that the injected failures heal while the demo runs.
    config = msgspec.structs.replace(
        setup.config, health=HealthPolicy(retry_backoff_seconds=(0.2, 0.4, 0.8), degraded_retry_seconds=2.0)
    )
    flaky_key = MemoryKey(TENANT, "user-0", "chat-0")
    summarizer = _FlakySummarizer(setup.summarizer, conversations[0][0].user_message)
    keys = [MemoryKey(TENANT, f"user-{i % 10}", f"chat-{i}") for i in range(len(conversations))]
    total = sum(len(c) for c in conversations)
    print(
        f"convmem demo: {len(conversations)} conversations, {total} turns, {args.planners} planners",
        file=sys.stderr,
    )
    if args.nats:
        print(f"on NATS at {redact_url(args.nats)} (tenant {TENANT!r})", file=sys.stderr)
    else:
        print(f"embedded nats-server with JetStream, data in {data_dir}", file=sys.stderr)
    try:
        return _run(args, config, summarizer, data_dir, keys, conversations, flaky_key, total)
    finally:
        if not args.keep and not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    config: ShortTermMemoryConfig,
    summarizer: _FlakySummarizer,
    data_dir: Path,
    keys: list[MemoryKey],
    conversations: list[list[ConversationTurn]],
    flaky_key: MemoryKey,
    total: int,
) -> int:
    with connect(
        args.nats or None,
        config=config,
        summarizer=summarizer,
        data_dir=data_dir,
        snapshot_every=20,
        auth=args.auth,
    ) as memory:
        earlier = sum(session_counts(memory.log, tenant_id=TENANT).values())
        if earlier:
            # Playing again would append the same conversations to the sessions already there (each
            # turn twice) and audit the two runs as one: refuse, and leave the stored run as it is.
            where = (
                f"the NATS server at {redact_url(args.nats)}" if args.nats else f"the data folder {data_dir}"
            )
            raise CliError(
                f"{where} already holds an earlier demo run (tenant {TENANT!r}, {earlier} events): "
                "give the demo a fresh --data-dir (or none, for a temporary one), or audit that run with "
                "'verify --all'",
                EXIT_INVALID,
            )
        progress = Progress("planners: turns stored", total, quiet=args.json)
        done = 0
        lock = threading.Lock()

        def plan(key: MemoryKey, turns: list[ConversationTurn]) -> None:
            nonlocal done
            session = memory.session(key)
            for turn in turns:
                session.add_turn(turn, timeout=30)
                # A planner that waits for the summary its turn made due, as one waiting for its next
                # prompt would: each summary then covers the same turns in every run of one --seed.
                session.flush(timeout=60)
                with lock:
                    done += 1
                    progress.update(done)

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.planners) as planners:
            for future in [planners.submit(plan, k, c) for k, c in zip(keys, conversations, strict=True)]:
                future.result()
        played = time.perf_counter() - started
        progress.close()
        for key in keys:
            memory.session(key).flush(timeout=60)
        live = {key: memory.session(key).snapshot_state() for key in keys}
        _show_session(memory.session(flaky_key).get_llm_context(), memory, flaky_key, args.json)

        # The auditor: read the whole tenant from the log, rebuild every session from its
        # events alone (no snapshot), and compare with the live state.
        audit = Progress("auditor: events read", quiet=args.json)
        started = time.perf_counter()
        audit.set_total(sum(session_counts(memory.log, tenant_id=TENANT).values()))
        checks = verify(memory.log, None, tenant_id=TENANT, live=live, progress=audit.update)
        replayed = time.perf_counter() - started
        audit.close()
        events = sum(c.events for c in checks)
        summaries = sum(c.summaries for c in checks)
        verified = sum(1 for c in checks if c.ok and c.key in live)
        for check in checks:
            for problem in check.problems:
                print(f"{check.key}: {problem}", file=sys.stderr)
    result = {
        "sessions": len(keys),
        "turns": total,
        "events": events,
        "summaries": summaries,
        "turns_per_s": round(total / played, 1),
        "replay_events_per_s": round(events / replayed, 1) if replayed else None,
        "verified": f"{verified}/{len(keys)}",
    }
    if args.json:
        emit_json(result)
    else:
        print("\nAudit: every session rebuilt from the log alone and compared with the live state")
        table([list(result.values())], list(result.keys()))
        if args.keep:
            print(
                f"\nthe log is kept in {data_dir}; audit it with  convmem --data-dir {data_dir} verify --all"
            )
    return EXIT_OK if verified == len(keys) else EXIT_FAILED


def _show_session(context: Mapping[str, Any], memory: Any, key: MemoryKey, as_json: bool) -> None:
    if as_json:
        return
    print(f"\nSession {key}: the context a planner would inject next")
    memo = context.get("conversation_memory", {})
    # The context as the planner gets it (a key only when it has content), its recent turns cut short.
    shown = {name: memo[name] for name in ("summary", "pending_turns") if name in memo}
    shown["recent_turns"] = memo.get("recent_turns", [])[-2:]
    print(readable({"conversation_memory": shown}))  # readable: a summary as its lines
    print(f"(showing the last 2 of {len(memo.get('recent_turns', []))} recent turns)")
    print(f"\nSession {key}: health history")
    rows = [
        (r.position, r.seq, r.detail)
        for r in timeline(memory.log.read(key))
        if r.type in ("health.changed", "session.started")
    ]
    table(rows, ["position", "seq", "event"])
