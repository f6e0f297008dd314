"""What query-aware recall costs at a live horizon: CPU per write, snapshot size, µs per view.

    python -m bench._recall_cost [--rounds 3] [--live 100,500,1000,2000]

Prints one JSON object. For each `live_turns` bound, a `recommended(2000)` session (recall on,
that bound, its extractive summarizer run whenever a summary is due) is filled with 50 more turns
than that (LoCoMo's utterances played in a loop when the data
is there, else `sample_turn`), then timed, best of the rounds, CPU time (`time.process_time`):

* ``write_us``: `decide` + `evolve` of one more turn on the full session (what every durable
  write pays in the writing process, before the log);
* ``snapshot_bytes`` and ``snapshot_encode_us``: the state's snapshot (`encode_state`);
* ``view_us``: `llm_context` with no query (the view every read without a query computes once
  per state, then serves from the cache);
* ``query_view_us`` and ``query_view_cl100k_us``: `llm_context` with a query (the text of an
  earlier turn), with the default estimate and with ``token_counter="cl100k_base"`` (computed
  from the state at every read: never cached); ``short_query_view_us``: with a short question.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator

import msgspec

from bench import _locomo as locomo
from bench import quality
from bench._common import sample_turn
from convmem.actors import encoding_counter
from convmem.adapters import recommended
from convmem.events import ConversationTurn, MemoryKey
from convmem.projections import AddTurn, SessionState, decide, encode_state, evolve, llm_context

__all__ = ["costs"]

KEY = MemoryKey("bench", "recall", "cost")
SHORT = "What did they say about the trip last weekend?"
"""A planner's short question (the other query is a whole earlier utterance, as a message may be)."""
DAY = 1_683_536_400.0


def _turns() -> Iterator[ConversationTurn]:
    folder = locomo.locomo_dir()
    played: list[ConversationTurn] = []
    if folder is not None:
        for path in sorted(folder.glob("*.json")):
            dialogue = locomo.load(path)
            for session in locomo.sessions(dialogue):
                played.extend(locomo.turns(session, str(dialogue["speaker_a"])))
    n = 0
    while True:
        base = played[n % len(played)] if played else sample_turn(n)
        yield msgspec.structs.replace(base, ts=DAY + n * 3600)
        n += 1


def _best(fn: Callable[[], object], rounds: int, calls: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def costs(live: int, rounds: int) -> dict[str, float]:
    setup = recommended(2000, worker_process=False)
    config = msgspec.structs.replace(setup.config, live_turns=live)
    game = quality._Game(quality._Player("cost", config, setup.summarizer), KEY, quality._Tally())
    turns = _turns()
    for _ in range(live + 50):  # the summarizer runs as it does in the quality bench
        game.play(next(turns))
    state: SessionState = game.state
    probe = next(turns)

    def write() -> None:
        after = state
        for event in decide(
            after, AddTurn(turn=probe), now=DAY + live, command_id="p", key=KEY, config=config
        ):
            after = evolve(after, event)

    query = state.turns[len(state.turns) // 3].turn.user_message or "what did they say about the trip"
    real = encoding_counter("cl100k_base")
    return {
        "live_turns": float(len(state.turns)),
        "write_us": _best(write, rounds, 300),
        "snapshot_bytes": float(len(encode_state(state))),
        "snapshot_encode_us": _best(lambda: encode_state(state), rounds, 20),
        "view_us": _best(lambda: llm_context(state), rounds, 20),
        "query_view_us": _best(lambda: llm_context(state, query=query), rounds, 20),
        "short_query_view_us": _best(lambda: llm_context(state, query=SHORT), rounds, 20),
        "query_view_cl100k_us": _best(lambda: llm_context(state, real, query=query), rounds, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--live", default="100,500,1000,2000")
    args = parser.parse_args()
    out = {bound: costs(int(bound), args.rounds) for bound in args.live.split(",")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
