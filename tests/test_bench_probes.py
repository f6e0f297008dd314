"""The bench's probes of where a turn's CPU goes run, and say what they measured (issue 28)."""

from __future__ import annotations

from bench._turn_phases import phases


def test_turn_phases_times_every_step_of_a_turn() -> None:
    figures = phases(1, calls=100)
    assert set(figures) == {
        "service request handling (parse, check, decode, encode)",
        "decide",
        "evolve",
        "encode + seal + checksum",
        "runtime counters (Metrics)",
        "Prometheus request counter (serve --metrics-port)",
    }
    assert all(value > 0 for value in figures.values()), figures
