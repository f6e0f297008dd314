"""The private parts of pykka and nats-py that convmem overrides or calls keep the shape it relies on.

`convmem/actors/_dispatch.py` runs pykka actors on a shared pool of threads
by overriding pykka's actor loop and inbox; `convmem/adapters/backends/jetstream/_client.py`
takes shortcuts through nats-py's client. Both libraries are bounded in
pyproject.toml. When a release inside those bounds changes one of these
internals, a test here fails and names it, before the runtime misbehaves.
"""

from __future__ import annotations

import inspect
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import pykka
import pykka._actor
import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from packaging.requirements import Requirement
from pykka._envelope import Envelope

from convmem.actors._dispatch import PooledActor

DISPATCH = "convmem/actors/_dispatch.py"
CLIENT = "convmem/adapters/backends/jetstream/_client.py"

Kind = Literal["static", "method", "coroutine"]


@dataclass(frozen=True)
class Internal:
    """A private callable of a library, as convmem overrides or calls it."""

    library: str
    owner: type[Any]
    name: str
    kind: Kind
    parameters: tuple[str, ...]
    """Its parameters after `self` (none for a static method without arguments)."""
    used_by: str

    def __str__(self) -> str:
        return f"{self.library}'s {self.owner.__name__}.{self.name}"


INTERNALS = [
    Internal("pykka", pykka.Actor, "_create_actor_inbox", "static", (), DISPATCH),
    Internal("pykka", pykka.Actor, "_create_future", "static", (), DISPATCH),
    Internal("pykka", pykka.Actor, "_start_actor_loop", "method", (), DISPATCH),
    Internal("pykka", pykka.Actor, "_actor_loop_setup", "method", (), DISPATCH),
    Internal("pykka", pykka.Actor, "_actor_loop_teardown", "method", (), DISPATCH),
    Internal("pykka", pykka.Actor, "_handle_receive", "method", ("message",), DISPATCH),
    Internal(
        "pykka",
        pykka.Actor,
        "_handle_failure",
        "method",
        ("exception_type", "exception_value", "traceback"),
        DISPATCH,
    ),
    Internal("pykka", pykka.Actor, "_stop", "method", (), DISPATCH),
    Internal("pykka", pykka._actor.ActorInbox, "put", "method", ("envelope",), DISPATCH),
    Internal("pykka", pykka._actor.ActorInbox, "get", "method", (), DISPATCH),
    Internal("pykka", pykka._actor.ActorInbox, "empty", "method", (), DISPATCH),
    Internal("nats-py", Client, "_process_headers", "coroutine", ("headers",), CLIENT),
    Internal(
        "nats-py", Client, "_process_msg", "coroutine", ("sid", "subject", "reply", "data", "headers"), CLIENT
    ),
    Internal("nats-py", Client, "_send_command", "coroutine", ("cmd", "priority"), CLIENT),
    Internal("nats-py", Client, "_remove_sub", "method", ("sid", "max_msgs"), CLIENT),
    Internal("nats-py", Client, "_flush_pending", "coroutine", ("force_flush",), CLIENT),
]


def _version(library: str) -> str:
    return metadata.version(library)


@pytest.mark.parametrize("internal", INTERNALS, ids=str)
def test_each_private_callable_convmem_overrides_or_calls_keeps_its_shape(internal: Internal) -> None:
    """The name exists, is the same kind of callable, and takes the same parameters in the same order."""
    where = (
        f"{internal} changed in {internal.library} {_version(internal.library)}: {internal.used_by} "
        f"overrides or calls it; adapt that module to the new shape and its tests, then move the bound "
        f"on {internal.library} in pyproject.toml"
    )
    found = inspect.getattr_static(internal.owner, internal.name, None)
    assert found is not None, f"{where} (it is gone)"
    if internal.kind == "static":
        assert isinstance(found, staticmethod), f"{where} (no longer a static method)"
    function = getattr(internal.owner, internal.name)
    is_coroutine = inspect.iscoroutinefunction(function)
    assert is_coroutine == (internal.kind == "coroutine"), (
        f"{where} ({'now' if is_coroutine else 'no longer'} a coroutine function)"
    )
    parameters = list(inspect.signature(function).parameters)
    if internal.kind != "static":
        parameters = parameters[1:]  # self
    assert tuple(parameters) == internal.parameters, (
        f"{where} (parameters {parameters}, convmem expects {list(internal.parameters)})"
    )


def test_pykka_builds_a_pooled_actors_inbox_and_envelopes_as_the_dispatcher_expects() -> None:
    """pykka asks the class for its inbox, and an envelope still carries `message` and `reply_to`."""

    class Idle(PooledActor):
        def on_receive(self, message: Any) -> Any:
            return message

    actor = Idle()
    version = _version("pykka")
    assert type(actor.actor_inbox).__name__ == "_Inbox", (
        f"pykka {version} no longer takes the inbox from Actor._create_actor_inbox: {DISPATCH} "
        "depends on it to queue actors on its dispatcher"
    )
    envelope = Envelope("hello")
    assert (envelope.message, envelope.reply_to) == ("hello", None), (
        f"pykka {version}'s Envelope no longer has message and reply_to: {DISPATCH} builds and reads them"
    )


def test_pykka_actors_init_sets_only_what_a_pooled_actor_sets_itself() -> None:
    """`PooledActor.__init__` sets pykka's fields itself (no random UUID, no `Event`): pykka must set
    no others, and `actor_ref` must still be built from them."""

    class Plain(pykka.ThreadingActor):
        pass

    class Idle(PooledActor):
        pass

    version = _version("pykka")
    plain, pooled = Plain(), Idle()
    assert (
        set(vars(plain)) == set(vars(pooled)) == {"actor_urn", "actor_inbox", "actor_stopped", "_actor_ref"}
    ), (
        f"pykka {version}'s Actor.__init__ sets {sorted(vars(plain))}: {DISPATCH}'s PooledActor.__init__ "
        "sets pykka's fields itself and must set the same"
    )
    ref = pooled.actor_ref
    assert (ref.actor_urn, ref.actor_inbox, ref.actor_stopped) == (
        pooled.actor_urn,
        pooled.actor_inbox,
        pooled.actor_stopped,
    ), f"pykka {version}'s ActorRef no longer copies the actor's urn, inbox and stopped flag"


def test_nats_clients_private_state_that_the_shortcuts_use_is_there() -> None:
    """A fresh client has the counters, limits and tables that `NatsClient` reads and updates."""
    client = Client()
    version = _version("nats-py")
    for name, kind in (("_max_payload", int), ("stats", dict), ("_subs", dict), ("options", dict)):
        assert isinstance(getattr(client, name, None), kind), (
            f"nats-py {version}'s Client.{name} is no longer a {kind.__name__}: {CLIENT} uses it"
        )
    for name in ("_flush_queue", "_flusher_task"):  # made on connect
        assert hasattr(client, name), f"nats-py {version}'s Client.{name} is gone: {CLIENT} uses it"
    status = f"nats-py {version}'s Client._status / Client.CONNECTED changed: {CLIENT}'s send_now reads them"
    assert isinstance(Client.CONNECTED, int), status
    assert client._status == Client.DISCONNECTED, status
    for name, kind in (("_pending", list), ("_pending_data_size", int), ("_max_pending_size", int)):
        assert isinstance(getattr(client, name, None), kind), (
            f"nats-py {version}'s Client.{name} is no longer a {kind.__name__}: {CLIENT}'s send_now "
            "queues commands there as _send_command does"
        )
    for counter in ("in_msgs", "in_bytes", "out_msgs", "out_bytes"):
        assert counter in client.stats, (
            f"nats-py {version}'s Client.stats has no {counter!r}: {CLIENT} counts it"
        )
    for flag in ("is_closed", "is_connected", "is_draining_pubs"):
        assert isinstance(getattr(client, flag, None), bool), (
            f"nats-py {version}'s Client.{flag} is no longer a bool property: {CLIENT} reads it"
        )
    subscription = Subscription(client, id=7, subject="probe")
    assert getattr(subscription, "_id", None) == 7, (
        f"nats-py {version}'s Subscription no longer keeps its id in _id: {CLIENT} routes messages by it"
    )


@pytest.mark.parametrize("library", ["pykka", "nats-py"])
def test_the_libraries_whose_internals_convmem_uses_are_bounded_and_installed_within_bounds(
    library: str,
) -> None:
    """An upper bound keeps a release that may reshape them out until convmem is checked against it."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    requirements = [Requirement(r) for r in project["project"]["dependencies"]]
    requirement = next(r for r in requirements if r.name == library)
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in requirement.specifier), (
        f"pyproject.toml must bound {library} from above (convmem uses its internals), got {requirement}"
    )
    assert requirement.specifier.contains(_version(library)), (
        f"the installed {library} {_version(library)} is outside pyproject.toml's {requirement.specifier}"
    )
