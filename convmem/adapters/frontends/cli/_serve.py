"""`convmem serve` (the memory service) and `convmem status` (its health and metrics).

Configuration comes from flags, each with an environment variable (listed in
`ENVIRONMENT`, which the docker files are checked against), and optionally a
JSON or TOML file holding a `ShortTermMemoryConfig` and, in its ``quotas``
table, the tenants' limits (`Quotas`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors._bounds import MAX_ACTOR_THREADS, MAX_LIVE_SESSIONS
from convmem.adapters._auth import redact_url
from convmem.adapters.backends.jetstream import JetStreamBackend, default_store_dir
from convmem.adapters.backends.summarizers import recommended
from convmem.adapters.frontends._connect import open_backend
from convmem.adapters.frontends.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    bounded_int,
    emit_json,
    key_settings,
    nats_url,
    open_store,
    positive_int,
    positive_seconds,
    read_document,
    table,
)
from convmem.adapters.frontends.cli._retention import load_retention
from convmem.adapters.frontends.cli._signals import SignalStop
from convmem.adapters.frontends.cli._workers import (
    Supervisor,
    WorkerSpec,
    default_workers,
    new_serve_id,
    summarizer_named,
)
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, check_api_prefix
from convmem.adapters.frontends.service._quotas import Quotas
from convmem.adapters.frontends.service._status import service_status
from convmem.errors import ConvmemError, InvalidConfig
from convmem.events import RetentionPolicies, ShortTermMemoryConfig

__all__ = ["ENVIRONMENT", "add_serve_command", "apply_serve_environment", "load_config", "load_quotas"]

ENVIRONMENT = {
    "CONVMEM_NATS_URL": "--nats: NATS URL(s) of an existing server or cluster (default: embedded server)",
    "CONVMEM_DATA_DIR": "--data-dir: the embedded server's data folder",
    "CONVMEM_STREAM": "--stream: event stream name",
    "CONVMEM_PREFIX": "--prefix: event subject prefix",
    "CONVMEM_BUCKET": "--bucket: snapshot bucket name",
    "CONVMEM_API_PREFIX": "--api-prefix: subject prefix of the service API",
    "CONVMEM_QUEUE_GROUP": "--queue-group: NATS queue group shared by the service instances",
    "CONVMEM_CONFIG": "--config: JSON or TOML file with the ShortTermMemoryConfig",
    "CONVMEM_TOTAL_TOKENS": "--total-tokens: context budget of the recommended config (no --config)",
    "CONVMEM_SUMMARIZER": "--summarizer: extractive (default, offline) or openai",
    "CONVMEM_MAX_LIVE_SESSIONS": "--max-live-sessions: live session actors at most",
    "CONVMEM_ACTOR_THREADS": "--actor-threads: threads the session actors share",
    "CONVMEM_SUMMARIZER_WORKERS": "--summarizer-workers: concurrent summarizer calls",
    "CONVMEM_REPLICAS": "--replicas: stream and bucket replicas (3 on a cluster)",
    "CONVMEM_WORKERS": "--workers: service processes sharing the sessions (default: the machine's cores)",
    "CONVMEM_PORT": "--port: the embedded nats-server's port (default: a free one; not with --nats)",
    "CONVMEM_RETENTION": "--retention: TOML or JSON file of retention policies (default: keep everything)",
    "CONVMEM_API_NATS_URL": "--api-nats: NATS URL(s) the API answers on, with the responder's credentials",
    "CONVMEM_MEMBERS_SECRET": "--members-secret: what the workers sign their membership with (default: new)",
    "CONVMEM_MASTER_KEY_FILE": "--master-key-file: the master key of encryption at rest (default: "
    "DATA_DIR/master.key, made on first use; mount it as a secret, apart from the data)",
    "CONVMEM_KEY_STORE": "--key-store: where the data keys are, a folder or nats[:BUCKET] (default: "
    "DATA_DIR/keys, or a bucket of their own on --nats)",
}


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def summarizer_choice(text: str) -> str:
    """An argparse type: a summarizer's name."""
    if text not in SUMMARIZERS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(SUMMARIZERS)}")
    return text


def queue_group(text: str) -> str:
    """An argparse type: a NATS queue group name (one token: no space, dot or wildcard)."""
    if not text or not _QUEUE_GROUP.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} must be one NATS token: letters, digits, _ and - (no space, dot, * or >)"
        )
    return text


SUMMARIZERS = ("extractive", "openai")
_QUEUE_GROUP = re.compile(r"^[A-Za-z0-9_\-]+$")


def apply_serve_environment(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with each serve option not given on the command line filled from its variable, checked
    as its flag is (a bad value: one line naming the variable, exit 2), else its default."""
    for dest, name, check, default in _SERVE_ENVIRONMENT:
        if getattr(args, dest, None) is not None:
            continue
        raw = os.environ.get(name)
        if not raw:
            setattr(args, dest, default)
            continue
        try:
            setattr(args, dest, check(raw))
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"{name}={raw!r}: {exc}", EXIT_USAGE) from None
    return args


def replica_count(text: str) -> int:
    """An argparse type: stream replicas, 1 to 5 (JetStream's limit)."""
    value = positive_int(text)
    if value > 5:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 to 5 (JetStream keeps at most 5 replicas)")
    return value


def api_prefix(text: str) -> str:
    """An argparse type: a subject prefix the service can answer under."""
    try:
        return check_api_prefix(text)
    except ConvmemError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 1 to 65535")
    return value


MAX_WORKERS = 256
"""The most worker processes one `convmem serve` runs (``--workers``)."""
MAX_EXPECTED = 10_000
"""The most replicas ``status --expect`` waits for (each silent one is a row of the report)."""
_threads = bounded_int(MAX_ACTOR_THREADS)  # --actor-threads, --summarizer-workers
_workers = bounded_int(MAX_WORKERS)
_live_sessions = bounded_int(MAX_LIVE_SESSIONS)

# The serve options read from the environment: (option's dest, variable, its check, default when
# neither is given). Only `serve` reads them, when it runs: a bad one is no other command's concern.
_SERVE_ENVIRONMENT: tuple[tuple[str, str, Callable[[str], Any], Any], ...] = (
    ("api_prefix", "CONVMEM_API_PREFIX", api_prefix, DEFAULT_API_PREFIX),
    ("queue_group", "CONVMEM_QUEUE_GROUP", queue_group, "convmem"),
    ("config", "CONVMEM_CONFIG", Path, None),
    ("total_tokens", "CONVMEM_TOTAL_TOKENS", _whole_number, 4000),
    ("summarizer", "CONVMEM_SUMMARIZER", summarizer_choice, "extractive"),
    ("max_live_sessions", "CONVMEM_MAX_LIVE_SESSIONS", _live_sessions, 256),
    ("actor_threads", "CONVMEM_ACTOR_THREADS", _threads, 64),
    ("summarizer_workers", "CONVMEM_SUMMARIZER_WORKERS", _threads, 4),
    ("replicas", "CONVMEM_REPLICAS", replica_count, 1),
    ("workers", "CONVMEM_WORKERS", _workers, None),
    ("port", "CONVMEM_PORT", port_number, None),
    ("retention", "CONVMEM_RETENTION", Path, None),
    ("api_nats", "CONVMEM_API_NATS_URL", str, None),
    ("members_secret", "CONVMEM_MEMBERS_SECRET", str, None),
    ("metrics_port", "CONVMEM_METRICS_PORT", port_number, None),
    ("metrics_host", "CONVMEM_METRICS_HOST", str, "127.0.0.1"),
)


def add_serve_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `serve` and `status` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser("serve", parents=[common], help="run the memory service (NATS request/reply API)")
    p.add_argument("--api-prefix", type=api_prefix)
    p.add_argument("--queue-group", type=queue_group)
    p.add_argument("--config", type=Path, help="JSON or TOML ShortTermMemoryConfig")
    p.add_argument(
        "--total-tokens",
        type=_whole_number,
        help="without --config: the recommended configuration for a context of this many tokens (4000)",
    )
    p.add_argument("--summarizer", type=summarizer_choice, metavar="{extractive,openai}")
    p.add_argument("--max-live-sessions", type=_live_sessions)
    p.add_argument("--actor-threads", type=_threads)
    p.add_argument(
        "--summarizer-workers",
        type=_threads,
    )
    p.add_argument("--replicas", type=replica_count)
    p.add_argument(
        "--workers",
        type=_workers,
        help="service processes sharing the sessions (default: this machine's cores)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        help="the embedded nats-server's port, so planners elsewhere know the URL "
        "(default: a free one; not with --nats; env CONVMEM_PORT)",
    )
    p.add_argument(
        "--retention",
        type=Path,
        help="TOML or JSON file of retention policies, swept every sweep_every by worker 0 "
        "(default: keep everything)",
    )
    p.add_argument(
        "--api-nats",
        help="NATS URL(s) of the API connection, with the credentials that answer requests (the responder "
        "of docker/nats-tenants.conf); default: the log's URL and credentials",
    )
    p.add_argument(
        "--members-secret",
        help="the secret the workers sign their membership announcements with: the same for every serve "
        "sharing the partitions (default: one drawn per serve; prefer the variable, argv is visible)",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        help="expose Prometheus metrics over HTTP: worker i on this port + i, at /metrics "
        "(default: none; env CONVMEM_METRICS_PORT)",
    )
    p.add_argument(
        "--metrics-host",
        help="the address the metrics endpoints listen on (default: 127.0.0.1, loopback only; "
        "env CONVMEM_METRICS_HOST)",
    )
    p.add_argument("--ready-file", type=Path, help="write the service's NATS URL here once it serves")
    p.set_defaults(run=cmd_serve)

    p = commands.add_parser(
        "status", parents=[common], help="health and metrics of every running service replica"
    )
    p.add_argument("--api-prefix", help=f"(default: {DEFAULT_API_PREFIX}; env CONVMEM_API_PREFIX)")
    p.add_argument(
        "--expect",
        type=bounded_int(MAX_EXPECTED),
        help="how many replicas should answer (fewer: exit 4, the silent shown)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="ask only the replica this machine runs (the one `convmem serve` recorded in its data folder)",
    )
    p.add_argument(
        "--discover",
        type=positive_seconds,
        default=0.5,
        help="seconds to wait for replicas to answer the ping",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_status)


def load_config(path: Path | None, total_tokens: int = 4000) -> ShortTermMemoryConfig:
    """The configuration in `path` (JSON or TOML), or the recommended one for `total_tokens`;
    errors name the bad field."""
    if path is None:
        try:
            return recommended(total_tokens=total_tokens).config
        except InvalidConfig as exc:
            raise CliError(f"--total-tokens: {exc.problem}", EXIT_USAGE) from None
    data = _read_config(path)
    _refuse_unknown(path, data, ShortTermMemoryConfig, "")
    try:
        return msgspec.convert(data, ShortTermMemoryConfig)
    except (msgspec.ValidationError, ValueError) as exc:
        raise CliError(f"config {path}: {exc}") from None


_FILE_TABLES = frozenset({"quotas"})
"""The configuration file's tables that are not the session configuration's (`load_quotas`)."""


def _refuse_unknown(path: Path, data: object, kind: type[msgspec.Struct], where: str) -> None:
    """`CliError` naming the first key of `data` that no setting of `kind` has, tables within
    included: a typo would otherwise leave the setting it meant at its default, silently (the log's
    decoder keeps ignoring unknown fields: a newer convmem's configuration still reads)."""
    if not isinstance(data, dict):
        return  # the conversion names a wrong type
    fields = {f.encode_name: f.type for f in msgspec.structs.fields(kind)}
    for name, value in data.items():
        if not where and name in _FILE_TABLES:
            continue
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise CliError(f"config {path}: {where}{name}: is not a setting (known: {known})")
        inner = fields[name]
        if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
            _refuse_unknown(path, value, inner, f"{where}{name}.")


def load_quotas(path: Path | None) -> Quotas:
    """The tenants' limits in the ``quotas`` table of the configuration file `path` (the defaults
    without one); an error names the key (``quotas.tenants.acme.max_bytes``)."""
    data = _read_config(path) if path is not None else {}
    if not isinstance(data, dict) or "quotas" not in data:
        return Quotas()
    try:
        return Quotas.from_mapping(data["quotas"])
    except InvalidConfig as exc:
        raise CliError(f"config {path}: {exc}") from None


def _read_config(path: Path) -> Any:
    return read_document(path, "config file")


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then stop the workers, then the embedded server: exit 0.

    The signals are this process's to handle from the start: a terminal's Ctrl-C
    (SIGINT to its foreground process group), a signal to the process group, or
    to this process alone all end here. The workers and the embedded server run
    in process groups of their own, so none of them stops under the others; this
    process stops them in order (workers first, each answering what it received).
    """
    apply_serve_environment(args)
    config = load_config(args.config, args.total_tokens)
    quotas = load_quotas(args.config)
    members_secret = _members_secret(args.members_secret)
    retention = load_retention(Path(args.retention)) if args.retention else None
    workers = default_workers() if args.workers is None else args.workers
    if args.port is not None and args.nats:
        raise CliError("--port is the embedded server's port: drop --nats (or --port)", EXIT_USAGE)
    if args.metrics_port is not None and args.metrics_port + workers - 1 > 65535:
        raise CliError(
            f"--metrics-port {args.metrics_port}: {workers} worker(s) need ports up to "
            f"{args.metrics_port + workers - 1}, past 65535",
            EXIT_USAGE,
        )
    try:  # what each worker will build, built once here: a bad setting is one line, before any start
        summarizer = summarizer_named(args.summarizer, config)
    except ConvmemError as exc:
        raise CliError(f"--summarizer {args.summarizer}: {exc}", EXIT_USAGE) from None
    close = getattr(summarizer, "close", None)
    if close is not None:
        close()
    stop = threading.Event()
    received: list[int] = []

    # The handler only notes the signal (no I/O: it may interrupt a write) and never takes `stop`'s
    # lock on the thread it interrupts, which may hold it (`_signals`).
    stops = SignalStop(stop, received.append).install((signal.SIGINT, signal.SIGTERM))
    try:
        return _serve(
            args,
            config,
            workers,
            stop,
            received,
            retention=retention,
            quotas=quotas,
            members_secret=members_secret,
        )
    finally:
        stops.close()


def _serve(
    args: argparse.Namespace,
    config: ShortTermMemoryConfig,
    workers: int,
    stop: threading.Event,
    received: list[int],
    *,
    retention: RetentionPolicies | None = None,
    quotas: Quotas | None = None,
    members_secret: bytes = b"",
) -> int:
    opened = open_backend(  # the embedded server if no URL; the stream and the bucket, made once
        args.nats,
        data_dir=args.data_dir,
        stream=args.stream,
        prefix=args.prefix,
        bucket=args.bucket,
        replicas=args.replicas,
        timeout=args.timeout,
        auth=args.auth,
        port=args.port,
        keys=key_settings(args),
    )
    if not isinstance(opened, JetStreamBackend):  # the service answers on the log's NATS server
        opened.close()
        raise CliError(
            "serve needs NATS: omit --nats for the embedded server, or give a nats:// URL", EXIT_USAGE
        )
    spec = WorkerSpec(
        url=opened.url,
        auth=args.auth if opened.server is None else None,
        stream=args.stream,
        prefix=args.prefix,
        bucket=args.bucket,
        replicas=args.replicas,
        timeout=args.timeout,
        keys=key_settings(args),
        config=config,
        summarizer=args.summarizer,
        max_live_sessions=args.max_live_sessions,
        actor_threads=args.actor_threads,
        summarizer_workers=args.summarizer_workers,
        api_prefix=args.api_prefix,
        queue_group=args.queue_group,
        serve=new_serve_id(),
        index=0,
        workers=workers,
        retention=retention,
        quotas=quotas or Quotas(),
        api_url=args.api_nats if opened.server is None else None,
        members_secret=members_secret,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    try:
        supervisor = Supervisor(spec, workers)
    except BaseException:
        opened.close()  # the embedded server and its folder go with it
        raise
    try:
        if stop.is_set():  # stopped while the log was opening
            serving = False
        else:
            try:
                serving = supervisor.start(stop)
            except RuntimeError as exc:  # WorkersFailed, or a worker process that could not start
                raise CliError(f"serve: {exc}") from None
        if serving:
            where = "embedded nats-server" if opened.server is not None else "NATS"
            print(
                f"convmem serve: {where} at {redact_url(opened.url)}, "
                f"API {args.api_prefix}.v1.<tenant>.<op>, "
                f"queue group {args.queue_group!r}, {workers} worker(s) {', '.join(supervisor.instances)} "
                f"(pids {', '.join(map(str, supervisor.pids))})",
                file=sys.stderr,
                flush=True,
            )
            if args.metrics_port is not None:
                print(
                    f"convmem serve: metrics at {_metrics_urls(args, workers)}", file=sys.stderr, flush=True
                )
            if args.data_dir or opened.server is not None:  # a folder of its own: the container's
                _record_instance(args, supervisor.serve, supervisor.instances)
            if args.ready_file is not None:
                args.ready_file.write_text(redact_url(opened.url), encoding="utf-8")
            supervisor.run(stop)
    finally:
        if received:
            print(f"convmem serve: {signal.Signals(received[0]).name}, stopping", file=sys.stderr, flush=True)
        clean = supervisor.stop()
        opened.close()
    if not clean:
        print("convmem serve: stopped; a worker did not stop cleanly", file=sys.stderr)
        return 1
    print("convmem serve: stopped; every acknowledged turn is in the log", file=sys.stderr)
    return EXIT_OK


def _metrics_urls(args: argparse.Namespace, workers: int) -> str:
    """The workers' metrics endpoints, one per worker (``http://127.0.0.1:9464/metrics``, then 9465...)."""
    host = f"[{args.metrics_host}]" if ":" in args.metrics_host else args.metrics_host
    return ", ".join(f"http://{host}:{args.metrics_port + i}/metrics" for i in range(workers))


def _members_secret(given: str | None) -> bytes:
    """What the workers sign their announcements with: `given` (``--members-secret``), else one drawn now.

    Workers of several `convmem serve` (several machines) share partitions only with the same secret.
    """
    if not given:
        return secrets.token_bytes(32)
    if len(given.encode()) < 16:
        raise CliError("--members-secret (CONVMEM_MEMBERS_SECRET) must be 16 bytes or more", EXIT_USAGE)
    return given.encode()


_SERVE_FILE = "convmem-serve.json"


def _serve_file(args: argparse.Namespace) -> Path:
    return Path(args.data_dir) if args.data_dir else default_store_dir()


def _record_instance(args: argparse.Namespace, serve: str, instances: list[str]) -> None:
    """Note this serve's worker ids in its data folder, for `status --local` (the health check).

    Only in a folder of its own: the embedded server's, or one given (`--data-dir`,
    ``CONVMEM_DATA_DIR``, as the image sets).
    """
    folder = _serve_file(args)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _SERVE_FILE).write_text(
            json.dumps({"serve": serve, "workers": instances, "pid": os.getpid()}), encoding="utf-8"
        )
    except OSError as exc:
        print(f"convmem serve: cannot record the instance for status --local: {exc}", file=sys.stderr)


def _local_instances(args: argparse.Namespace) -> list[str]:
    path = _serve_file(args) / _SERVE_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        instances, pid = [str(i) for i in recorded["workers"]], int(recorded["pid"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise CliError(
            f"no convmem serve recorded in {path.parent} (start one, or drop --local)", 4
        ) from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise CliError(f"the convmem serve recorded in {path.parent} (pid {pid}) is not running", 4) from None
    except PermissionError:
        pass  # alive, another user's
    return instances


def cmd_status(args: argparse.Namespace) -> int:
    args.api_prefix = args.api_prefix or os.environ.get("CONVMEM_API_PREFIX") or DEFAULT_API_PREFIX
    url = nats_url(args)
    if not url:
        raise CliError(
            "status asks running services over NATS: give --server URL (or NATS_URL); no convmem serve "
            "runs on the embedded data folder",
            EXIT_USAGE,
        )
    check_api_prefix(args.api_prefix)
    only = _local_instances(args) if args.local else None
    erasures = _pending_erasures(args, url)
    replicas = asyncio.run(
        service_status(
            url,
            auth=args.auth,
            api_prefix=args.api_prefix,
            timeout=args.timeout,
            discover=args.discover,
            only=only,
        )
    )
    missing = max(0, (args.expect or 0) - len(replicas))
    rows = [msgspec.to_builtins(r) for r in replicas] + [
        {"instance": "?", "health": None, "metrics": None, "problem": "silent: did not answer the ping"}
        for _ in range(missing)
    ]
    if args.json:
        emit_json(
            {
                "replicas": rows,
                "answered": sum(r.ok for r in replicas),
                "expected": args.expect,
                "erasures": erasures,
            }
        )
    else:
        _status_tables(rows)
        _erasures_line(erasures)
    if not replicas:
        raise CliError(f"no convmem service answered on {redact_url(url)} (api prefix {args.api_prefix})", 4)
    return EXIT_OK if missing == 0 and all(r.ok for r in replicas) else 4


def _pending_erasures(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """How many erasures are pending in the journal and how old the oldest is (no id: counts only).

    Read-only: nothing is created. A journal these credentials cannot read is
    reported as unknown, with why.
    """
    try:
        with open_store(args, read_only=True, url=url, lost_ok=True) as opened:  # the journal only
            pending = opened.journal.pending() if opened.journal is not None else []
    except ConvmemError as exc:
        return {"pending": None, "oldest_age_s": None, "problem": str(exc)}
    oldest = min((r.at for r in pending), default=None)
    age = None if oldest is None else round(max(0.0, time.time() - oldest), 1)
    return {"pending": len(pending), "oldest_age_s": age, "problem": None}


def _erasures_line(erasures: dict[str, Any]) -> None:
    if erasures["pending"] is None:
        print(f"pending erasures: unknown ({erasures['problem']})")
    elif erasures["pending"]:
        print(
            f"pending erasures: {erasures['pending']} (oldest {erasures['oldest_age_s']:.0f} s old): "
            "`convmem erase --resume` or any convmem that starts on this store finishes them"
        )
    else:
        print("pending erasures: 0")


def _status_tables(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(f"replica {row['instance']}")
        worker = (row["health"] or {}).get("worker")
        if worker:
            print(
                f"  worker {worker.get('index', '?')} of {worker.get('of', '?')} "
                f"of serve {worker.get('serve')} "
                f"(pid {worker.get('pid')}): {worker.get('partitions', '-')} partitions, "
                f"{worker.get('members', '-')} workers seen"
            )
        if row["problem"] is not None:
            print(f"  {row['problem'].upper()}")
            continue
        health, metrics = row["health"] or {}, row["metrics"] or {}
        service = metrics.get("service", {})
        append = metrics.get("append_ms") or {}
        table(
            [
                ("status", health.get("status")),
                ("log", health.get("log")),
                ("uptime", f"{health.get('uptime_s', 0):.0f} s"),
                ("live sessions", health.get("live_sessions")),
                ("requests in flight", health.get("in_flight")),
                ("requests", service.get("requests")),
                ("errors", service.get("errors")),
                ("turns", metrics.get("turns")),
                ("summaries", metrics.get("summaries")),
                ("summary failures", metrics.get("summary_failures")),
                ("conflicts", metrics.get("conflicts")),
                ("append p50 / p99 (ms)", f"{append.get('p50', '-')} / {append.get('p99', '-')}"),
            ],
            ["  measure", "value"],
        )
