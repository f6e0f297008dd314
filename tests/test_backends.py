"""Open backends: the `Backend` protocol and the one registry of URL schemes that every entry point uses."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import convmem
from convmem.actors import MemorySystem, SystemOptions, SystemSettings
from convmem.adapters import (
    MEMORY_URL,
    Backend,
    BackendOptions,
    ConnectOptions,
    InMemoryBackend,
    open_backend,
    open_backend_here,
    register_backend,
)
from convmem.adapters.frontends.cli._main import main
from convmem.errors import InvalidInput, UnknownSetting
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

KEY = MemoryKey("acme", "alice", "chat-1")
TURN = ConversationTurn(user_message="hello", assistant_response="hi")


class ScratchBackend(InMemoryBackend):
    """A backend from outside convmem: in memory, remembering its URL, options and whether it closed."""

    def __init__(self, url: str, options: BackendOptions, here: bool) -> None:
        super().__init__()
        self.url = url
        self.options = options
        self.here = here
        self.closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


class ScratchOpener:
    """Opens ``scratch://`` URLs; records each backend it opened."""

    def __init__(self) -> None:
        self.opened: list[ScratchBackend] = []

    def open(self, url: str | None, options: BackendOptions) -> Backend:
        assert url is not None
        self.opened.append(ScratchBackend(url, options, here=False))
        return self.opened[-1]

    async def open_here(self, url: str | None, options: BackendOptions) -> Backend:
        assert url is not None
        asyncio.get_running_loop()  # called from a coroutine
        self.opened.append(ScratchBackend(url, options, here=True))
        return self.opened[-1]


SCRATCH = ScratchOpener()
register_backend("scratch", SCRATCH)


def test_a_registered_scheme_is_opened_by_every_entry_point() -> None:
    """connect, connect_here, open_backend and open_backend_here open a new backend by its scheme alone."""
    with convmem.connect("scratch://one", config=ShortTermMemoryConfig(strategy="truncation")) as memory:
        memory.session(KEY).add_turn(TURN, timeout=5)
        backend = SCRATCH.opened[-1]
        assert (backend.url, backend.here) == ("scratch://one", False)
        assert [e.key for e in backend.log.read_all()] == [KEY, KEY]  # the session lives in that backend
    assert backend.closed  # the system owns what connect opened

    async def from_a_coroutine() -> ScratchBackend:
        memory = await convmem.connect_here("scratch://two", snapshot_every=3)
        try:
            return SCRATCH.opened[-1]
        finally:
            await memory.aclose()

    here = asyncio.run(from_a_coroutine())
    assert (here.url, here.here, here.closed) == ("scratch://two", True, True)
    assert here.options == {}  # the system's settings are not the backend's

    opened = open_backend("scratch://three", stream="EVENTS", read_only=True)
    assert opened is SCRATCH.opened[-1]
    assert SCRATCH.opened[-1].options == {"stream": "EVENTS", "read_only": True}
    opened.close()
    opened_here = asyncio.run(open_backend_here("scratch://four"))
    assert SCRATCH.opened[-1].here
    opened_here.close()


def test_a_registered_scheme_serves_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI opens its log through the same registry: a new scheme works there too."""
    assert main(["--nats", "scratch://cli", "sessions", "--tenant", "acme"]) == 3  # an empty log
    assert "no sessions in tenant acme" in capsys.readouterr().err
    assert SCRATCH.opened[-1].url == "scratch://cli"
    assert SCRATCH.opened[-1].closed


def test_a_backend_that_fails_to_become_a_system_is_closed() -> None:
    """A bad system setting after the backend opened closes the backend, from threads and coroutines;
    a keyword that names no setting is refused before anything opens (still a TypeError)."""
    opened = len(SCRATCH.opened)
    with pytest.raises(UnknownSetting, match="max_live_sesions") as caught:
        convmem.connect("scratch://bad", max_live_sesions=3)  # type: ignore[call-arg]
    assert isinstance(caught.value, TypeError)
    assert len(SCRATCH.opened) == opened
    with pytest.raises(ValueError, match="idle_seconds"):
        convmem.connect("scratch://bad", idle_seconds=0)
    assert SCRATCH.opened[-1].url == "scratch://bad"
    assert SCRATCH.opened[-1].closed

    async def from_a_coroutine() -> None:
        await convmem.connect_here("scratch://bad-here", max_live_sessions=0)

    with pytest.raises(ValueError, match="max_live_sessions"):
        asyncio.run(from_a_coroutine())
    assert SCRATCH.opened[-1].closed


def test_an_unknown_scheme_is_refused_naming_the_known_ones() -> None:
    """A URL of no registered scheme is an InvalidInput naming it and the schemes there are."""
    for url in ("http://127.0.0.1:4222", "127.0.0.1:4222", "nats://a:4222,http://b:4222", "memory://x"):
        with pytest.raises(InvalidInput, match="is not a NATS URL") as caught:
            open_backend(url)
        assert "memory://" in str(caught.value)
        assert "scratch://" in str(caught.value)


def test_a_scheme_registers_once_under_a_plain_name() -> None:
    """Registering a taken scheme, or one that is no lowercase name, is refused."""
    with pytest.raises(InvalidInput, match=r"nats:// is already registered"):
        register_backend("nats", SCRATCH)
    for bad in ("Scratch2", "s+x", ""):
        with pytest.raises(InvalidInput, match="lowercase name"):
            register_backend(bad, SCRATCH)


def test_memory_url_opens_the_in_memory_backend() -> None:
    """``memory://`` is a registered scheme like any other."""
    opened = open_backend(MEMORY_URL)
    assert isinstance(opened, InMemoryBackend)
    opened.close()


def test_serve_refuses_a_backend_without_nats(capsys: pytest.CaptureFixture[str]) -> None:
    """convmem serve answers on the log's NATS server: any other backend is a usage error."""
    assert main(["--nats", MEMORY_URL, "serve"]) == 2
    assert "serve needs NATS" in capsys.readouterr().err
    assert main(["--nats", "scratch://serve", "serve"]) == 2
    assert SCRATCH.opened[-1].closed
    assert "serve needs NATS" in capsys.readouterr().err


def test_connect_takes_every_keyword_of_the_system() -> None:
    """`ConnectOptions` is the backend's options, the system's `SystemSettings` and `config`; what
    `MemorySystem` takes beside those is what `connect` sets itself (timeout: the backend's)."""
    owned = {"snapshots", "journal", "on_close", "timeout"}
    passed = set(ConnectOptions.__optional_keys__) - set(BackendOptions.__optional_keys__)
    assert passed == set(SystemSettings.__optional_keys__) | {"config"}
    assert set(SystemOptions.__optional_keys__) - set(SystemSettings.__optional_keys__) == owned
    assert list(inspect.signature(MemorySystem).parameters) == ["config", "log", "options"]
