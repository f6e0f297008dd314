"""`convmem serve --workers N`: N service processes sharing the sessions, supervised by the first.

The supervisor opens the log once (starting the embedded nats-server if no
URL was given, creating the stream and the bucket), then starts each worker
as a child process with the ``spawn`` method (a fresh interpreter: a process
holding threads is never forked). Each worker runs its own `MemorySystem`
and a partitioned `MemoryService` on the same NATS, both on one event loop
(an ``add_turn`` is decided, appended and answered there, no thread in
between): NATS routes each
session's requests to the worker owning its partition (see
`convmem.adapters.frontends.service._partitions`), so one session is served by one
process at a time, and workers of other `convmem serve` processes, on other
machines of a NATS cluster, share the partitions the same way.

A worker that dies is started again (after 0.5 s, doubling up to 30 s while
it keeps dying within a minute of its start), under the same instance id, so
it takes back the same partitions. SIGTERM or SIGINT to the supervisor (or to
its process group: a terminal's Ctrl-C) stops every worker (each answers the
requests it already received), then the supervisor. The workers, like the
embedded nats-server, leave the supervisor's process group, so only the
supervisor receives a group's signal and it stops them in order. A
supervisor that dies outright (SIGKILL) takes its workers with it (the
kernel sends each a SIGTERM).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from convmem.actors import MemorySystem, Summarizer
from convmem.adapters._auth import NatsAuth
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.backends import PrometheusMetrics, default_export_registry
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.backends.summarizers import ExtractiveSummarizer, OpenAIChatSummarizer
from convmem.adapters.frontends._connect import open_backend_here
from convmem.adapters.frontends.cli._safe import SafeStream
from convmem.adapters.frontends.cli._signals import SignalStop
from convmem.adapters.frontends.service._quotas import Quotas
from convmem.adapters.frontends.service._service import MemoryService
from convmem.errors import ConvmemError
from convmem.events import RetentionPolicies, ShortTermMemoryConfig

__all__ = ["Supervisor", "WorkerSpec", "WorkersFailed", "default_workers", "run_worker"]

_RESTART_FIRST = 0.5
_RESTART_MAX = 30.0
_PR_SET_PDEATHSIG = 1
_STABLE = 60.0  # a worker that ran this long before dying is restarted after the first delay again
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_DUMP_SIGNAL = signal.SIGUSR1
"""Sent by the supervisor to a worker that did not stop in time: the worker writes its threads' stacks."""


class WorkersFailed(ConvmemError, RuntimeError):
    """The service's workers did not start: one exited before it served, or not all served in time."""


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to serve (picklable: it crosses to the spawned process)."""

    url: str
    auth: NatsAuth | None
    stream: str | None
    prefix: str | None
    bucket: str | None
    replicas: int
    timeout: float
    keys: KeySettings
    """Where the master key and the key store are (the embedded default's resolved by the parent)."""
    config: ShortTermMemoryConfig
    summarizer: str
    max_live_sessions: int
    actor_threads: int
    summarizer_workers: int
    api_prefix: str
    queue_group: str
    serve: str
    index: int
    workers: int
    retention: RetentionPolicies | None = None
    """Retention policies: worker 0 of each serve sweeps with them (sweeps are safe concurrently)."""
    quotas: Quotas = field(default_factory=Quotas)
    """Each tenant's limits in each worker's service."""
    api_url: str | None = None
    """The API connection's URL (its credentials: the responder's); None: `url`."""
    members_secret: bytes = b""
    """What the workers sign their membership announcements with (shared by every worker)."""
    metrics_port: int | None = None
    """Worker `index` exposes Prometheus metrics on ``metrics_port + index`` (None: no metrics endpoint)."""
    metrics_host: str = "127.0.0.1"
    """The address the metrics endpoints listen on (loopback unless told)."""

    @property
    def instance(self) -> str:
        return f"{self.serve}-{self.index}"

    @property
    def own_metrics_port(self) -> int | None:
        """This worker's metrics port (``metrics_port + index``), or None."""
        return None if self.metrics_port is None else self.metrics_port + self.index


def summarizer_named(name: str, config: ShortTermMemoryConfig) -> Summarizer:
    """The summarizer `serve --summarizer` names."""
    if name == "openai":
        return OpenAIChatSummarizer(max_tokens=config.budget.summary_max_tokens)
    return ExtractiveSummarizer(max_tokens=config.budget.summary_max_tokens)


def run_worker(spec: WorkerSpec, report: Connection) -> None:
    """A worker process's body: serve until SIGTERM/SIGINT; says ``ready`` on `report` once serving.

    It starts with SIGINT and SIGTERM ignored (see `_born_ignoring_stops`), leaves
    the supervisor's process group, and only then takes the signals: one sent to
    that group meanwhile (a terminal's Ctrl-C) is no interrupt mid-import; the
    supervisor, which got it too, repeats its SIGTERM until the worker stops.
    From then on only its supervisor (or a signal to its own pid) stops it.
    """
    sys.stdout = SafeStream(sys.stdout)  # a log line may quote a tenant's text
    sys.stderr = SafeStream(sys.stderr, secret_free=True)
    stop = threading.Event()
    with contextlib.suppress(OSError):  # already a group leader (not under a supervisor)
        os.setpgid(0, 0)
    stops = SignalStop(stop).install(_STOP_SIGNALS)  # never `stop.set()` in the handler: see `_signals`
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # the mask came from the supervisor too
    _dump_stacks_on(_DUMP_SIGNAL)
    _stop_with_parent(stop)
    try:
        if stops.stopping():  # asked to stop before it served: nothing to open, nothing to answer
            return
        _serve(spec, report, stop, stops.stopping)
    except (ConvmemError, ValueError) as exc:  # a setting or the log: one line, and the supervisor says more
        print(f"convmem serve worker {spec.index}: {_one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as exc:  # a bug: still one line, and the exit code says so
        print(
            f"convmem serve worker {spec.index}: internal error ({type(exc).__name__}: {_one_line(exc)}); "
            "please report it",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(70)
    finally:
        # Stopping already: the supervisor's repeated SIGTERM must not kill the interpreter's
        # shutdown (which puts back the default action of a signal that has a Python handler).
        stops.close()
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _dump_stacks_on(signum: int) -> None:
    """Have `signum` write every thread's stack to stderr (file and function names only, no values).

    The supervisor sends it to a worker that did not stop in time, before killing it, so
    that the operator sees where the worker was stuck.
    """
    stream = sys.__stderr__
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
        faulthandler.register(signum, file=stream, all_threads=True)


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _serve(spec: WorkerSpec, report: Connection, stop: threading.Event, stopping: Callable[[], bool]) -> None:
    """Open the log, build the system and the service, and serve until `stop`.

    A stop asked for while it started (`stopping`) ends it before it says ``ready``: a worker that
    exits 0 unready tells the supervisor, which may have missed the signal, that serve stops.
    """
    options: dict[str, Any] = {
        "replicas": spec.replicas,
        "timeout": spec.timeout,
        "auth": spec.auth,
        "keys": spec.keys,
    }
    for name in ("stream", "prefix", "bucket"):
        if getattr(spec, name) is not None:
            options[name] = getattr(spec, name)
    loop = EventLoopThread(name=f"convmem-worker-{spec.index}")  # the log's and the service's
    try:
        wait = spec.timeout + 30.0
        opened = loop.call(lambda: open_backend_here(spec.url, **options), timeout=wait, what="the log")
    except BaseException:
        loop.stop()
        raise
    if spec.index == 0 and spec.retention is not None:
        _report_sweeps(spec.index)
    metrics = PrometheusMetrics() if spec.metrics_port is not None else None
    exposed: Any = None
    try:
        system = MemorySystem(
            spec.config,
            log=opened.log,
            snapshots=opened.snapshots,
            journal=opened.journal,
            exports=default_export_registry(),
            summarizer=summarizer_named(spec.summarizer, spec.config),
            max_live_sessions=spec.max_live_sessions,
            actor_threads=spec.actor_threads,
            summarizer_workers=spec.summarizer_workers,
            retention=spec.retention if spec.index == 0 else None,
            metrics=metrics,
        )
        try:
            service = MemoryService(
                system,
                spec.api_url or spec.url,
                api_prefix=spec.api_prefix,
                queue_group=spec.queue_group,
                auth=spec.auth,
                partitioned=True,
                members_secret=spec.members_secret,
                instance=spec.instance,
                worker={"serve": spec.serve, "index": spec.index, "of": spec.workers, "pid": os.getpid()},
                loop=loop,
                quotas=spec.quotas,
                metrics=metrics,
            )
            if metrics is not None and spec.own_metrics_port is not None:
                exposed, _thread = metrics.serve(spec.own_metrics_port, spec.metrics_host)
            service.start()
            _freeze_start_up()
            if stopping():
                service.stop()
                return
            report.send(("ready", spec.instance))
            service.run_forever(stop)
        finally:
            system.close()
    finally:
        if exposed is not None:
            exposed.shutdown()
            exposed.server_close()
        opened.close()
        loop.stop()


def _freeze_start_up() -> None:
    """Move what start-up made (modules, classes, the service's tables) out of the collector's reach.

    A full collection walks every tracked object while every thread waits; a worker's start-up
    objects live as long as it does, so walking them again finds nothing and only stalls the
    requests in flight (tens of milliseconds a walk, issue 28). A worker is a process of
    convmem's own, so it may make this choice; a library embedding convmem makes its own.
    """
    gc.collect()
    gc.freeze()


def _report_sweeps(index: int) -> None:
    """The retention sweeps' summaries on stderr (a spawned worker has no logging set up)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"convmem serve: worker {index}: %(levelname)s %(message)s"))
    sweeps = logging.getLogger("convmem.retention")
    sweeps.addHandler(handler)
    sweeps.setLevel(logging.INFO)


def _stop_with_parent(stop: threading.Event) -> None:
    """Have the kernel send SIGTERM if the supervisor dies (even by SIGKILL): no orphaned worker serves on."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's SIGTERM is the only way
        return
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():  # it died before the request took effect
        stop.set()


@dataclass
class _Slot:
    """One worker index: its process, when it started, how long to wait before the next restart."""

    spec: WorkerSpec
    process: BaseProcess | None = None
    report: Connection | None = None
    started: float = 0.0
    ready: bool = False
    delay: float = _RESTART_FIRST
    restart_at: float | None = None
    restarts: int = 0


class Supervisor:
    """Starts the workers, restarts a dead one, stops them all (see the module docstring)."""

    stop_grace = 15.0
    """Seconds past the drain time a stopping worker has to close the memory and the log."""

    def __init__(self, spec: WorkerSpec, workers: int, *, drain_timeout: float = 30.0) -> None:
        self.serve = spec.serve
        self.drain_timeout = drain_timeout
        self._context = multiprocessing.get_context("spawn")
        self._slots = [
            _Slot(WorkerSpec(**{**spec.__dict__, "index": i, "workers": workers})) for i in range(workers)
        ]

    @property
    def instances(self) -> list[str]:
        return [slot.spec.instance for slot in self._slots]

    @property
    def pids(self) -> list[int | None]:
        return [slot.process.pid if slot.process is not None else None for slot in self._slots]

    def _start(self, slot: _Slot) -> None:
        if slot.report is not None:  # the dead worker's end
            slot.report.close()
        receive, send = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=run_worker, args=(slot.spec, send), name=f"convmem-worker-{slot.spec.index}"
        )
        with _born_ignoring_stops():
            process.start()
        send.close()
        slot.process, slot.report, slot.started, slot.ready = process, receive, time.monotonic(), False

    def start(self, stop: threading.Event, timeout: float = 120.0) -> bool:
        """Start every worker; True once all serve, False if `stop` came first. A worker that fails
        before it ever served stops them all with `WorkersFailed` (its error is on stderr); one that
        ended with 0 before it served was stopped, so serve stops too (`stop` is set).

        A Ctrl-C to the group can reach a starting worker (pending while it ignores the signals, then
        delivered once it takes them) and not this process: Python drops a signal whose handler
        becomes SIG_IGN before its Python-level handler ran, as it does for a moment around each
        worker's start.
        """
        for slot in self._slots:
            self._start(slot)
        deadline = time.monotonic() + timeout
        while not all(slot.ready for slot in self._slots):
            if stop.is_set():
                return False
            self._poll(0.25)
            if stop.is_set():  # a worker told to stop with the rest may have exited meanwhile
                return False
            for slot in self._slots:
                if not slot.ready and slot.process is not None and slot.process.exitcode is not None:
                    if slot.process.exitcode == 0:  # a worker ends 0 only when told to stop: a stop
                        stop.set()  # signal reached serve's group, and this process may have missed it
                        return False
                    raise WorkersFailed(
                        f"worker {slot.spec.index} exited with {slot.process.exitcode} before serving"
                    )
            if time.monotonic() > deadline:
                raise WorkersFailed(f"the workers did not all serve within {timeout:g}s")
        return True

    def run(self, stop: threading.Event) -> None:
        """Supervise until `stop` is set: a dead worker is started again after its delay."""
        while not stop.is_set():
            self._poll(0.5)
            now = time.monotonic()
            for slot in self._slots:
                process = slot.process
                if process is not None and process.exitcode is not None and slot.restart_at is None:
                    lived = now - slot.started
                    slot.delay = _RESTART_FIRST if lived >= _STABLE else slot.delay
                    slot.restart_at = now + slot.delay
                    print(
                        f"convmem serve: worker {slot.spec.index} (pid {process.pid}) exited with "
                        f"{process.exitcode}; starting it again in {slot.delay:g}s",
                        file=sys.stderr,
                        flush=True,
                    )
                    slot.delay = min(_RESTART_MAX, slot.delay * 2)
                if slot.restart_at is not None and now >= slot.restart_at and not stop.is_set():
                    slot.restart_at = None
                    slot.restarts += 1
                    self._start(slot)

    def _poll(self, timeout: float) -> None:
        """Wait up to `timeout` for a worker to exit or report; note the reports."""
        waitables: list[Any] = []
        for slot in self._slots:
            if slot.process is not None and slot.process.exitcode is None:
                waitables.append(slot.process.sentinel)
            if slot.report is not None:
                waitables.append(slot.report)
        for ready in multiprocessing.connection.wait(waitables, timeout):
            for slot in self._slots:
                if ready is slot.report:
                    try:
                        kind, _ = slot.report.recv()
                    except (EOFError, OSError):
                        slot.report.close()
                        slot.report = None
                        continue
                    slot.ready = slot.ready or kind == "ready"

    def stop(self) -> bool:
        """SIGTERM to every worker, wait for them (SIGKILL past the drain time); True if all exited 0."""
        running = [s.process for s in self._slots if s.process is not None and s.process.exitcode is None]
        clean = True
        deadline = time.monotonic() + self.drain_timeout + self.stop_grace
        # Again and again: a worker still starting ignores SIGTERM until `run_worker` takes it
        # (a handler that only sets its stop flag, so a repeat changes nothing for one that has).
        while (left := [p for p in running if p.exitcode is None]) and time.monotonic() < deadline:
            for process in left:
                process.terminate()
            multiprocessing.connection.wait([p.sentinel for p in left], min(0.5, deadline - time.monotonic()))
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                print(
                    f"convmem serve: worker pid {process.pid} did not stop; its threads' stacks follow, "
                    "then it is killed",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(process.pid, _DUMP_SIGNAL)  # type: ignore[arg-type]  # pid is set once started
                process.join(1.0)  # the dump is written from the signal handler at once
                process.kill()
                process.join(10.0)
            if process.exitcode != 0:
                print(
                    f"convmem serve: worker pid {process.pid} ended with {process.exitcode}",
                    file=sys.stderr,
                    flush=True,
                )
            clean = clean and process.exitcode == 0
        for slot in self._slots:
            if slot.report is not None:
                slot.report.close()
                slot.report = None
        return clean


@contextlib.contextmanager
def _born_ignoring_stops() -> Iterator[None]:
    """Children started meanwhile ignore SIGINT and SIGTERM until `run_worker` takes them.

    An ignored disposition survives fork and exec (a blocked mask does not survive the
    spawn), and Python leaves an ignored SIGINT alone: a signal to this process group
    while a worker imports is no KeyboardInterrupt there. Here the signals are blocked
    for as long as they are ignored, so one sent meanwhile waits, pending, for the
    handlers put back, and is not lost. (Only the main thread sets handlers; elsewhere
    children are started as they are.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Started first: starting it unblocks the stop signals on its way out, which would open
    # a moment in which this process ignores them.
    resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def new_serve_id() -> str:
    """An id for one `convmem serve`; its workers are ``<id>-0`` .. ``<id>-<N-1>``."""
    return uuid.uuid4().hex[:10]
