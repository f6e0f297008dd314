"""Write the golden encoded bytes of every event type (run from the repository root).

    .venv/bin/python tests/golden/make_golden.py

The examples below are fixed; `tests/test_codec.py` decodes every file written
here and checks it equals its example, so a schema change that breaks bytes
already stored fails the tests. Files are never regenerated for an existing
version: a breaking change adds a new tag (and an upcaster), and new golden
files are written next to the old ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

from convmem.events import (
    AgentsMemoryConfig,
    BacklogTrimmed,
    ConversationTurn,
    EntityMention,
    EntityTally,
    Event,
    HealthChanged,
    HealthPolicy,
    HistoryCompacted,
    ItemPopped,
    ItemsAdded,
    KeptTurn,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionErased,
    SessionRepaired,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TrajectoryDigest,
    TurnAdded,
    TurnsAdopted,
    encode_event,
    encode_event_json,
    event_tag,
)

GOLDEN_DIR = Path(__file__).resolve().parent / "v1"
"""Version 1 of the event schema (convmem 0.1)."""

KEY = MemoryKey("acme.corp", "alice@example.com", "chat:*>1 ü")

TURN = ConversationTurn(
    user_message="What pricing tiers do you offer?",
    assistant_response='Basic, Pro and Enterprise. "Pro" is $49/month.',
    trajectory_digest=TrajectoryDigest(
        tools_invoked=("search_pricing", "calculate_discount"),
        observations_summary="- search_pricing: 3 tiers\n- calculate_discount: 10% annual",
        reasoning_summary="compared tiers",
        artifacts_refs=("artifact://pricing-table",),
    ),
    artifacts_shown={"table": [{"tier": "Pro", "usd": 49}], "ok": True, "ratio": 0.5},
    artifacts_hidden_refs=("artifact://raw",),
    ts=1765700000.25,
    items=(
        MessageItem(kind="reasoning", content="look up the tiers"),
        MessageItem(
            kind="function_call", call_id="call_1", name="search_pricing", arguments='{"q": "tiers"}'
        ),
        MessageItem(kind="function_call_output", call_id="call_1", name="search_pricing", output="3 tiers"),
        MessageItem(kind="message", role="assistant", content="Checking prices…"),
    ),
    entities=(EntityMention(name="Pro tier", kind="plan", attributes={"price": "$49/month"}),),
)

PLAIN_TURN = ConversationTurn(user_message="I'll take Pro", assistant_response="Done.", ts=1765700010.0)

CONFIG = ShortTermMemoryConfig(
    strategy="rolling_summary",
    budget=MemoryBudget(
        full_zone_turns=3, summary_max_tokens=500, total_max_tokens=4000, overflow_policy="truncate_summary"
    ),
    summarizer_model="claude-3-haiku",
    include_trajectory_digest=False,
    recovery_backlog_limit=7,
    retry_attempts=2,
    health=HealthPolicy(
        retry_backoff_seconds=(1.0, 3.0), degraded_retry_seconds=15.0, summarize_timeout_seconds=20.0
    ),
    agents=AgentsMemoryConfig(strategy="compacting", compact_keep=1, compact_tool_calls=True),
)

SUMMARY = (
    "<session_summary>\nThe user compared tiers.\n<key_facts>\n- Plan: Pro\n</key_facts>\n</session_summary>"
)

EXAMPLES: dict[str, Event] = {
    "session.started": SessionStarted(
        seq=1,
        event_id="cmd-1/1",
        at=1765700000.0,
        key=KEY,
        config=CONFIG,
        injected_summary="<session_summary>earlier chat</session_summary>",
        injected_from=MemoryKey("acme.corp", "alice@example.com", "chat-0"),
    ),
    "turn.added": TurnAdded(seq=2, event_id="cmd-2/1", at=1765700000.5, index=1, turn=TURN),
    "summary.produced": SummaryProduced(
        seq=3, event_id="cmd-3/1", at=1765700002.0, summary=SUMMARY, covers_from=1, covers_through=1
    ),
    "health.changed": HealthChanged(
        seq=4,
        event_id="cmd-4/1",
        at=1765700004.0,
        old=MemoryHealth.RETRY,
        new=MemoryHealth.DEGRADED,
        reason="summarizer timed out",
        attempt=1,
    ),
    "backlog.trimmed": BacklogTrimmed(
        seq=5, event_id="cmd-5/2", at=1765700005.0, dropped_through=1, reason="backlog over limit"
    ),
    "session.cleared": SessionCleared(
        seq=6, event_id="cmd-6/1", at=1765700006.0, cleared_through=1, reason="cleared by caller"
    ),
    "session.restored": SessionRestored(
        seq=7, event_id="cmd-7/1", at=1765700007.0, summary=SUMMARY, turns=(PLAIN_TURN, TURN), first_index=2
    ),
    "session.erased": SessionErased(seq=8, event_id="erase-1", at=1765700008.0, reason="GDPR request"),
    "items.added": ItemsAdded(
        seq=9,
        event_id="cmd-9/1",
        at=1765700009.0,
        items=(
            MessageItem(
                kind="message", role="user", content="Book it", raw='{"content":"Book it","role":"user"}'
            ),
            MessageItem(kind="function_call", call_id="call_2", name="book", arguments="{}"),
            MessageItem(kind="other", raw='{"type":"web_search_call","id":"ws_1"}'),
        ),
        first_index=3,
    ),
    "item.popped": ItemPopped(
        seq=10,
        event_id="cmd-10/1",
        at=1765700010.0,
        item=MessageItem(kind="other", raw='{"type":"web_search_call","id":"ws_1"}'),
    ),
    # Added in 0.2 (the PenguiFlow drop-in): a new tag, and new fields of old tags under
    # "tag+field" names (the old files keep the fields at their defaults).
    "turns.adopted": TurnsAdopted(
        seq=11,
        event_id="adopt/penguiflow=3Aunbound/4/turns.adopted/1",
        at=1765700011.0,
        source=MemoryKey("penguiflow:unbound", "penguiflow:unbound", "0f3c9a"),
        source_seq=4,
        turns=(PLAIN_TURN, TURN),
        first_index=5,
    ),
    "session.cleared+moved_to": SessionCleared(
        seq=12,
        event_id="cmd-12/1",
        at=1765700012.0,
        cleared_through=2,
        reason="turns moved to the session's key",
        moved_to=KEY,
    ),
    "session.restored+origin": SessionRestored(
        seq=13,
        event_id="import/ab12/session.restored/1",
        at=1765700013.0,
        summary=SUMMARY,
        turns=(PLAIN_TURN,),
        first_index=3,
        origin="penguiflow-state:sha256:ab12",
    ),
    # Added with fork (issue 17): where a forked session came from.
    "session.started+forked": SessionStarted(
        seq=1,
        event_id="fork/3f2a/1",
        at=1765700000.0,
        key=KEY,
        config=CONFIG,
        forked_from=MemoryKey("acme.corp", "alice@example.com", "chat-0"),
        forked_at=1234,
    ),
    # Added with retention (issue 24): a compaction that opens a history at any seq.
    "history.compacted": HistoryCompacted(
        seq=14,
        event_id="retention/5be1c0de",
        at=1765800000.0,
        key=KEY,
        config=CONFIG,
        turns=(
            KeptTurn(index=9, at=1765700009.5, turn=PLAIN_TURN),
            KeptTurn(index=10, at=1765700010.5, turn=TURN),
        ),
        next_index=11,
        summary=SUMMARY,
        summary_through=8,
        dropped_through=3,
        health=MemoryHealth.RETRY,
        attempt=1,
        health_since=1765700012.0,
        injected_summary="<session_summary>earlier chat</session_summary>",
        injected_from=MemoryKey("acme.corp", "alice@example.com", "chat-0"),
        last_at=1765700013.0,
        idempotency_keys=("order-17", "order-18"),
        retired_through=8,
        entities=(
            EntityTally(
                name="Pro tier", kind="plan", attributes={"price": "$49/month"}, mentions=3, last_mention=5
            ),
        ),
        entity_mentions=5,
        dropped_events=13,
        dropped_turns=8,
        reason="21 turns stored, over max_turns 2",
    ),
    # Added with damage repair (issue 24): an operator restored a damaged session.
    "session.repaired": SessionRepaired(
        seq=14,
        event_id="repaired/5d1e",
        at=1765700014.0,
        state=b"\x83\xa3key\xc0\xa7version\x0c\xa7started\xc3",
        method="snapshot",
        restored_seq=12,
        damage=("event seq 13 missing: the store lost it",),
        unreadable=1,
        reason="restored from the snapshot at seq 12",
    ),
    # Added with retention (issue 24): older turns a compaction keeps past the live horizon.
    "history.compacted+history": HistoryCompacted(
        seq=15,
        event_id="retention/5be1c0df",
        at=1765800001.0,
        key=KEY,
        config=CONFIG,
        turns=(KeptTurn(index=10, at=1765700010.5, turn=TURN),),
        next_index=11,
        history=(KeptTurn(index=8, at=1765700008.5, turn=PLAIN_TURN),),
        dropped_events=12,
        dropped_turns=7,
        reason="10 turns stored, over max_turns 3",
    ),
}
"""One fixed example per golden file: per event tag, with every field set away from its default,
and per field added later (``tag+field``)."""


def main() -> int:
    """Write the files of tags that have none yet; existing golden bytes are never rewritten."""
    GOLDEN_DIR.mkdir(exist_ok=True)
    for tag, event in EXAMPLES.items():
        assert event_tag(event) == tag.split("+")[0], (tag, event_tag(event))
        for path, data in (
            (GOLDEN_DIR / f"{tag}.msgpack", encode_event(event)),
            (GOLDEN_DIR / f"{tag}.json", encode_event_json(event) + b"\n"),
        ):
            if path.exists():
                continue
            path.write_bytes(data)
            print(f"wrote {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
