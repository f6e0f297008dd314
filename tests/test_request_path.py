"""The service's per-request shortcuts (issue 28): what is remembered answers as the first parse did."""

from __future__ import annotations

import gc

import pytest

from convmem.adapters import PrometheusMetrics
from convmem.adapters.frontends.cli._workers import _freeze_start_up
from convmem.adapters.frontends.service import _inboxes, _protocol
from convmem.adapters.frontends.service._errors import UnknownOperation
from convmem.adapters.frontends.service._inboxes import OPERATOR, requester
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, parse_subject, routed_subject
from convmem.errors import InvalidKey
from convmem.events import _key as key_module
from convmem.events import decode_token, encode_token

P = DEFAULT_API_PREFIX


def _slow_encode(value: str) -> str:
    return "".join(c if c in key_module._SAFE else "".join(f"={b:02X}" for b in c.encode()) for c in value)


@pytest.mark.parametrize("value", ["acme", "acme_corp-2", "a.b", "é", "a=b", "", "x y", "ZZ9", "-_-"])
def test_tokens_of_plain_ids_are_the_ids_and_every_token_decodes_back(value: str) -> None:
    token = encode_token(value)
    assert token == _slow_encode(value)
    assert decode_token(token) == value


@pytest.mark.parametrize("token", ["a=2", "a=2e", "a.b", "a b", "=41"])
def test_tokens_it_could_not_have_made_are_refused(token: str) -> None:
    with pytest.raises(InvalidKey):
        decode_token(token)


def test_a_parsed_subject_parses_the_same_again_and_a_bad_one_is_refused_every_time() -> None:
    subject = routed_subject(P, "acme", "u", "s", "add_turn")
    assert parse_subject(P, subject) == parse_subject(P, subject) == ("acme", "add_turn")
    assert parse_subject(P, f"{P}.v1.a=2Eb.context") == ("a.b", "context")
    for _ in range(2):
        with pytest.raises(UnknownOperation):
            parse_subject(P, f"{P}.v1.acme.no_such_op")
        with pytest.raises(InvalidKey):
            parse_subject(P, f"{P}.v1.a=2.add_turn")


def test_the_remembered_subjects_stay_bounded() -> None:
    for i in range(_protocol._PARSED_LIMIT + 10):
        parse_subject(P, routed_subject(P, f"t{i}", "u", "s", "add_turn"))
        requester(P, f"{P}.v1.t{i}.add_turn")
    assert len(_protocol._PARSED) <= _protocol._PARSED_LIMIT
    assert len(_inboxes._REQUESTERS) <= _inboxes._REQUESTERS_LIMIT
    assert requester(P, f"{P}.v1.t1.add_turn") == "t1"
    assert requester(P, f"{P}.ops.v1.health") == OPERATOR
    assert requester(P, "elsewhere.v1.t1.add_turn") is None


def test_request_counts_go_to_each_tenants_label_and_past_the_bound_to_others() -> None:
    metrics = PrometheusMetrics(max_tenants=2)
    for token in ("a", "b", "c", "a", "c", "d"):
        metrics.request(token, "add_turn", None)
    metrics.request("a", "get_context", "SessionClosed")

    def count(tenant: str, op: str) -> float | None:
        return metrics.registry.get_sample_value(
            "convmem_service_requests_total", {"tenant": tenant, "op": op}
        )

    assert (count("a", "add_turn"), count("b", "add_turn"), count("_other", "add_turn")) == (2, 1, 3)
    assert count("a", "get_context") == 1
    errors = {"tenant": "a", "error": "SessionClosed"}
    assert metrics.registry.get_sample_value("convmem_service_errors_total", errors) == 1


def test_a_worker_freezes_what_its_start_up_made() -> None:
    held = [[n] for n in range(1000)]  # start-up's objects, alive for the worker's life
    try:
        _freeze_start_up()
        assert gc.get_freeze_count() >= len(held)
    finally:
        gc.unfreeze()
