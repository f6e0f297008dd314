"""Run the OpenAI Agents SDK's own session tests against `ConvmemSession`.

    python tests/agents_sdk_suite.py /path/to/openai-agents-python [--mode memory|nats|remote|all]

Give it a checkout of the SDK's source at the version installed here (its
``tests/`` folder, with the SDK's test dependencies installed: pytest-asyncio,
pytest-mock, inline-snapshot, cryptography). It runs the SDK's session suites
(`SUITES`) with this file as a pytest plugin, which replaces the SDK's
`SQLiteSession` (and, in the human-in-the-loop scenario, its list-backed test
session) in every test module with a stand-in built on `ConvmemSession`:

* ``memory``: sessions of one `MemorySystem` in the test process, on the
  in-memory log;
* ``nats``: the same on a JetStream log (an embedded nats-server);
* ``remote``: sessions served by a real ``convmem serve`` process on an
  embedded nats-server, through `convmem.connect_remote`.

A SQLite file stands for a tenant of its own and ``":memory:"`` for a fresh
one, so two stand-ins on one file share their sessions and no other test's.
Only tests that built a stand-in count; those that reach into SQLite's
internals are deselected, each with its reason (`EXCLUDED`, which the README
lists). Nothing of the SDK is copied here: the plugin only swaps a name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SUITES = (
    "tests/memory/test_session.py",
    "tests/memory/test_session_limit.py",
    "tests/memory/test_session_context_wrapper.py",
    "tests/memory/test_session_persistence_sanitize.py",
    "tests/test_hitl_session_scenario.py",
    "tests/extensions/memory/test_encrypt_session.py",
    "tests/test_agent_runner.py",
    "tests/test_agent_runner_streamed.py",
    "tests/test_max_turns.py",
    "tests/test_soft_cancel.py",
    "tests/test_run_impl_resume_paths.py",
    "tests/test_tool_batch_failure_history.py",
    "tests/test_native_tool_failure_history.py",
    "tests/test_tool_failure_boundaries.py",
    "tests/test_programmatic_tool_calling.py",
)
"""The SDK's test files that use a session (paths inside an SDK checkout)."""

LIST_SESSION_MODULES = ("tests.test_hitl_session_scenario",)
"""Modules whose list-backed `SimpleListSession` is the session under test (the HITL scenario)."""

_CONNECTIONS = "inspects SQLite's per-thread connections (_connections, _connections_lock)"
_ROWS = "writes corrupt JSON rows straight into SQLite's message table"
_WRITE_LOCK = "drops SQLite tables or probes SQLite's file write lock and transactions"
_VALIDATED_POP = (
    "EncryptedSession authenticates a pop inside SQLite's transaction only for a real SQLiteSession "
    "(its private _pop_item_with_validation); convmem keeps every popped item in the log instead"
)
_SESSION_TEST = "tests/memory/test_session.py::"
_ENCRYPTED_TEST = "tests/extensions/memory/test_encrypt_session.py::"

EXCLUDED: dict[str, str] = {
    _SESSION_TEST + "test_sqlite_session_close_closes_worker_thread_connections": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_reaps_connections_from_exited_worker_threads": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_closes_retired_connections_before_the_next_allocation": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_keeps_connections_of_live_worker_threads": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_rollback_failure_evicts_connection": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_close_retries_quarantined_connection": _CONNECTIONS,
    _SESSION_TEST + "test_sqlite_session_closed_rejects_empty_add_items": (
        "SQLiteSession.close() closes its database; a convmem session holds no connection of its own "
        "(the MemorySystem or RemoteMemory outlives it)"
    ),
    _SESSION_TEST + "test_sqlite_session_pop_item_skips_corrupt_most_recent": _ROWS,
    _SESSION_TEST + "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _ROWS,
    _SESSION_TEST + "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _ROWS,
    _SESSION_TEST + "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _ROWS,
    _SESSION_TEST + "test_sqlite_session_file_lock_is_shared_across_instances": (
        "checks SQLiteSession's process-wide registry of file locks (_lock, _file_locks)"
    ),
    _SESSION_TEST + "test_sqlite_session_failed_add_items_releases_write_lock": _WRITE_LOCK,
    _SESSION_TEST + "test_sqlite_session_failed_clear_session_rolls_back": _WRITE_LOCK,
    _SESSION_TEST + "test_sqlite_session_failed_pop_item_releases_write_lock": _WRITE_LOCK,
    _SESSION_TEST + "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": (
        "replaces SQLiteSession's connection (_get_connection) to pause inside sqlite3's commit"
    ),
    _ENCRYPTED_TEST + "test_encrypted_compaction_skips_unencrypted_stored_history": (
        "needs SQLiteSession's private compaction snapshot (_get_compaction_snapshot)"
    ),
    _ENCRYPTED_TEST + "test_encrypted_pop_authentication_is_atomic_with_concurrent_mutations": _VALIDATED_POP,
    _ENCRYPTED_TEST + "test_encrypted_pop_cancellation_waits_for_authentication_rollback": _VALIDATED_POP,
    _ENCRYPTED_TEST + "test_encrypted_pop_rechecks_authentication_after_expired_tail": _VALIDATED_POP,
    _ENCRYPTED_TEST + "test_encrypted_pop_wrong_key_preserves_recoverable_history": _VALIDATED_POP,
    _ENCRYPTED_TEST + "test_encrypted_pop_wrong_key_preserves_row_identity": _VALIDATED_POP,
    _ENCRYPTED_TEST + "test_encrypted_session_scan_budget_rejects_negative_limit_before_read": (
        "relies on SQLite reading everything for a negative LIMIT; convmem refuses a negative limit "
        "with InvalidInput (the SDK's Redis session returns nothing)"
    ),
    "tests/test_run_impl_resume_paths.py::test_handoff_resume_after_cancelled_compaction_commits": (
        "replaces SQLiteSession's private _insert_items to pause its worker thread before the commit"
    ),
}
"""SDK test ids (file::name, without parameters) deselected, with why: each reaches into SQLite."""

MODES = ("memory", "nats", "remote")
TENANT_PREFIX = "sdk"
USER = "sdk-user"

_built: list[str] = []
"""Stand-ins built during the current test (cleared before each)."""


# The stand-ins -------------------------------------------------------------------------------


def _memory() -> Any:
    memory = _BACKEND.get("memory")
    if memory is None:
        raise RuntimeError("the convmem SDK-suite plugin has no backend: run it through agents_sdk_suite.py")
    return memory


def _tenant(db_path: object) -> str:
    """A tenant of its own per SQLite file; ``:memory:`` is a fresh one each time."""
    if str(db_path) == ":memory:":
        return f"{TENANT_PREFIX}-{uuid.uuid4().hex}"
    resolved = Path(str(db_path)).expanduser().resolve()
    return f"{TENANT_PREFIX}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:24]}"


def _stand_ins() -> tuple[type, type]:
    from convmem.adapters import ConvmemSession  # noqa: PLC0415 (after the backend is chosen)

    class SQLiteStandIn(ConvmemSession):
        """`SQLiteSession`'s constructor, answered by a convmem session."""

        def __init__(
            self,
            session_id: str,
            db_path: str | os.PathLike[str] = ":memory:",
            sessions_table: str = "agent_sessions",
            messages_table: str = "agent_messages",
            session_settings: Any = None,
        ) -> None:
            del sessions_table, messages_table  # SQLite's table names: nothing to name here
            super().__init__(
                session_id,
                _memory(),
                tenant_id=_tenant(db_path),
                user_id=USER,
                session_settings=session_settings,
            )
            self.db_path = db_path
            _built.append(session_id)

        def close(self) -> None:
            """The memory outlives the session: nothing to release."""

    class ListStandIn(ConvmemSession):
        """The SDK's list-backed test session (`session_id`, `history`), answered by convmem."""

        def __init__(self, session_id: str = "test", history: list[Any] | None = None) -> None:
            super().__init__(session_id, _memory(), tenant_id=_tenant(":memory:"), user_id=USER)
            if history:
                _seed(self, history)
            _built.append(session_id)

    return SQLiteStandIn, ListStandIn


def _seed(session: Any, history: list[Any]) -> None:
    """Store `history` before the test uses the session (blocking: constructors are synchronous)."""
    import asyncio  # noqa: PLC0415
    import threading  # noqa: PLC0415

    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(session.add_items(list(history)))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)  # the test's own loop may be running on this thread
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]


# The backends --------------------------------------------------------------------------------

_BACKEND: dict[str, Any] = {}


def _start_backend(mode: str, work: Path) -> None:
    import convmem  # noqa: PLC0415
    from convmem.adapters import EmbeddedNatsServer  # noqa: PLC0415

    if mode == "memory":
        _BACKEND["memory"] = convmem.connect(convmem.adapters.MEMORY_URL)
        return
    server = EmbeddedNatsServer(work / "nats").start()
    _BACKEND["server"] = server
    if mode == "nats":
        _BACKEND["memory"] = convmem.connect(server.url)
        return
    ready = work / "ready"
    err = open(work / "serve.err", "wb")  # noqa: SIM115 (kept open for the process's life)
    _BACKEND["serve_err"] = err
    serve = subprocess.Popen(
        [sys.executable, "-m", "convmem", "--nats", server.url, "serve", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    _BACKEND["serve"] = serve
    while not ready.exists():
        try:
            code = serve.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        raise RuntimeError(f"convmem serve exited with {code}: {(work / 'serve.err').read_text()}")
    _BACKEND["memory"] = convmem.connect_remote(server.url, timeout=30.0)


def _described_backend() -> str:
    memory = _BACKEND.get("memory")
    if memory is None:
        return "nothing"
    if "serve" in _BACKEND:
        requests = memory.service_metrics()["service"]["requests"]
        return f"{type(memory).__name__}, a convmem serve process that answered {requests} requests"
    return f"{type(memory).__name__} on {type(memory.log).__name__}"


def _stop_backend() -> None:
    memory = _BACKEND.pop("memory", None)
    if memory is not None:
        memory.close()
    serve = _BACKEND.pop("serve", None)
    if serve is not None:
        serve.terminate()
        serve.wait(60)
        _BACKEND.pop("serve_err").close()
    server = _BACKEND.pop("server", None)
    if server is not None:
        server.stop()


# The pytest plugin ----------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("convmem")
    group.addoption("--convmem-mode", choices=MODES, default="memory", help="where the sessions live")
    group.addoption("--convmem-report", default=None, help="write the counts here (JSON)")


def _base_id(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


_WORK: list[Path] = []  # the run's folder, removed once the backend has stopped


def pytest_configure(config: pytest.Config) -> None:
    work = Path(tempfile.mkdtemp(prefix="convmem-sdk-"))
    _WORK.append(work)
    _start_backend(config.getoption("--convmem-mode"), work)


def pytest_unconfigure(config: pytest.Config) -> None:
    try:
        _stop_backend()
    finally:
        while _WORK:
            shutil.rmtree(_WORK.pop(), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import agents  # noqa: PLC0415
    import agents.memory  # noqa: PLC0415

    sqlite_stand_in, list_stand_in = _stand_ins()
    agents.SQLiteSession = sqlite_stand_in  # type: ignore[attr-defined,misc]
    agents.memory.SQLiteSession = sqlite_stand_in  # type: ignore[attr-defined,misc]
    kept, dropped = [], []
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "SQLiteSession"):
            module.SQLiteSession = sqlite_stand_in
        if module is not None and module.__name__ in LIST_SESSION_MODULES:
            module.SimpleListSession = list_stand_in
        (dropped if _base_id(item.nodeid) in EXCLUDED else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_setup(item: pytest.Item) -> None:
    _built.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    results = _results
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if _built or report.nodeid in results:
            results[report.nodeid] = report.outcome
    elif report.when == "teardown" and report.outcome == "failed" and report.nodeid in results:
        results[report.nodeid] = "failed"


_results: dict[str, str] = {}
"""The outcome of every test that built a stand-in, by node id."""


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = _results
    counts = {
        outcome: sum(1 for o in results.values() if o == outcome)
        for outcome in ("passed", "failed", "skipped")
    }
    mode = config.getoption("--convmem-mode")
    terminalreporter.write_sep("=", f"convmem ({mode}): tests that used a ConvmemSession")
    terminalreporter.write_line(json.dumps(counts))
    terminalreporter.write_line(f"sessions through: {_described_backend()}")
    for nodeid, outcome in sorted(results.items()):
        if outcome != "passed":
            terminalreporter.write_line(f"{outcome.upper()} {nodeid}")
    path = config.getoption("--convmem-report")
    if path:
        report = {"mode": mode, "counts": counts, "results": results, "excluded": EXCLUDED}
        Path(path).write_text(json.dumps(report, indent=2, sort_keys=True))


# The runner ------------------------------------------------------------------------------------


def run(sdk: Path, mode: str, extra: list[str]) -> dict[str, Any]:
    """Run the suites in `sdk` with sessions in `mode`; the counts the plugin wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        suites = [s for s in SUITES if (sdk / s).exists()]
        command = [
            sys.executable, "-m", "pytest", "-p", "agents_sdk_suite", "-p", "no:cacheprovider",
            "-q", "--convmem-mode", mode, "--convmem-report", str(report), *suites, *extra,
        ]  # fmt: skip
        subprocess.run(command, cwd=sdk, env=env, check=False)
        result: dict[str, Any] = json.loads(report.read_text())
        return result


def _iter_modes(mode: str) -> Iterator[str]:
    yield from (MODES if mode == "all" else (mode,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("sdk", type=Path, help="a checkout of openai-agents-python")
    parser.add_argument("--mode", choices=(*MODES, "all"), default="all")
    args, extra = parser.parse_known_args(argv)
    if not (args.sdk / "tests" / "memory").is_dir():
        parser.error(f"{args.sdk} has no tests/memory folder: give the root of an SDK checkout")
    failed = False
    summary = {}
    for mode in _iter_modes(args.mode):
        result = run(args.sdk, mode, extra)
        summary[mode] = result["counts"]
        failed = failed or result["counts"]["failed"] > 0
    print(json.dumps(summary, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
