"""Create the events stream and the snapshots bucket when missing; check them when present.

An existing stream or bucket whose configuration differs from what convmem
needs is reported as `InvalidConfig` naming every difference. It is never
updated silently: a changed duplicate window or subject layout would weaken
the guarantees of data already stored.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import nats.js.errors

from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.errors import InvalidConfig, StoreNotFound

_log = logging.getLogger("convmem.jetstream")

__all__ = [
    "SETUP_TIMEOUT",
    "bucket_config",
    "check_exists",
    "check_names",
    "create_stream",
    "ensure_bucket",
    "ensure_stream",
    "open_bucket",
    "setup_request",
    "setup_wait",
    "stream_config_of",
    "stream_info_of",
    "subject_pattern",
]

_NS = 1_000_000_000

SETUP_TIMEOUT = 30.0
"""How long creating or checking a stream or bucket may wait for the server's answer, at least. On a
cluster the answer waits for the replicas to form the stream's group and elect its leader, which a
cluster that has just started, or one on a loaded machine, can take several seconds to do: longer
than a write's timeout (`NatsConnection.timeout`, 5 s by default)."""


def setup_wait(conn: NatsConnection) -> float:
    """How long a set-up request on `conn` may wait: `SETUP_TIMEOUT`, or the connection's timeout if more."""
    return max(conn.timeout, SETUP_TIMEOUT)


async def setup_request(conn: NatsConnection, subject: str, request: dict[str, Any] | None = None) -> Any:
    """A JetStream API request made while creating, checking or replacing a stream: waits `setup_wait`."""
    return await conn.api(subject, request, timeout=setup_wait(conn))


async def create_stream(conn: NatsConnection, config: dict[str, Any]) -> bool:
    """Create the stream `config` names; False when another process made it meanwhile."""
    try:
        await setup_request(conn, f"$JS.API.STREAM.CREATE.{config['name']}", config)
    except nats.js.errors.APIError as exc:
        if exc.err_code != 10058:  # 10058: created meanwhile by another process
            raise
        return False
    return True


_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def check_names(*, stream: str | None = None, prefix: str | None = None, bucket: str | None = None) -> None:
    """Refuse names NATS would reject or that could reach another stream's subjects."""
    if stream is not None and not _NAME.match(stream):
        raise InvalidConfig("stream", f"{stream!r} must be letters, digits, '_' or '-'")
    if bucket is not None and not _NAME.match(bucket):
        raise InvalidConfig("bucket", f"{bucket!r} must be letters, digits, '_' or '-'")
    if prefix is not None and not all(_TOKEN.match(t) for t in prefix.split(".")):
        raise InvalidConfig(
            "prefix", f"{prefix!r} must be dot-separated tokens of letters, digits, '_' or '-'"
        )


def subject_pattern(prefix: str) -> str:
    """The stream's one subject pattern: ``{prefix}.{tenant}.{user}.{session}``."""
    return f"{prefix}.*.*.*"


def _stream_config(name: str, prefix: str, *, replicas: int, duplicate_window: float) -> dict[str, Any]:
    return {
        "name": name,
        "subjects": [subject_pattern(prefix)],
        "retention": "limits",
        "storage": "file",
        "num_replicas": replicas,
        "duplicate_window": int(duplicate_window * _NS),
        "max_age": 0,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_msgs_per_subject": -1,
        "max_msg_size": -1,
        "discard": "old",
        "allow_direct": True,
        "allow_atomic": True,
        "deny_purge": False,
    }


async def ensure_stream(
    conn: NatsConnection, name: str, prefix: str, *, replicas: int, duplicate_window: float
) -> None:
    """Create the events stream if missing; raise `InvalidConfig` if it exists and differs."""
    wanted = _stream_config(name, prefix, replicas=replicas, duplicate_window=duplicate_window)
    found = await stream_config_of(conn, name)
    if found is None:
        try:
            if await create_stream(conn, wanted):
                return
        except nats.js.errors.APIError as exc:
            if exc.err_code == 10065:  # subjects overlap with another stream
                raise InvalidConfig(
                    "prefix",
                    f"subjects {wanted['subjects']} overlap another stream's on the server "
                    f"({exc.description}); choose another prefix or remove that stream",
                ) from None
            raise
        found = await stream_config_of(conn, name)
        assert found is not None
    if found.get("discard") == "new" and int(found.get("max_bytes", -1)) > 0:
        # An operator's cap on the whole stream: past it writes are refused (`StoreFull`), no
        # event is ever dropped to make room (discard "old" would drop the oldest: refused below).
        wanted = {**wanted, "max_bytes": found["max_bytes"], "discard": "new"}
    _compare(f"stream {name!r}", wanted, found, ignore={"name"})


def bucket_config(bucket: str, *, replicas: int) -> dict[str, Any]:
    """A key-value bucket's stream as nats-py's ``create_key_value`` makes it, but deletable by message.

    ``deny_delete`` is off so a snapshot can be erased for good (``STREAM.MSG.DELETE``
    overwrites its bytes), which NATS cannot turn off on an existing stream.
    """
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "num_replicas": replicas,
        "max_msgs_per_subject": 1,
        "max_age": 0,
        "discard": "new",
        "duplicate_window": 120 * _NS,
        "allow_rollup_hdrs": True,
        "deny_delete": False,
        "deny_purge": False,
        "allow_direct": True,
    }


async def ensure_bucket(conn: NatsConnection, bucket: str, *, replicas: int) -> None:
    """Create the snapshots key-value bucket if missing; raise `InvalidConfig` if it differs.

    A bucket an earlier convmem made (the same settings, but message deletes denied) is
    replaced: it holds only snapshots, which sessions rebuild from the log.
    """
    stream = f"KV_{bucket}"
    found = await stream_config_of(conn, stream)
    if found is None:
        if await create_stream(conn, bucket_config(bucket, replicas=replicas)):
            return
        found = await stream_config_of(conn, stream)
        assert found is not None
    wanted = {
        "subjects": [f"$KV.{bucket}.>"],
        "storage": "file",
        "num_replicas": replicas,
        "max_msgs_per_subject": 1,
        "allow_rollup_hdrs": True,
        "max_age": 0,
    }
    _compare(f"key-value bucket {bucket!r}", wanted, found, ignore=set())
    if found.get("deny_delete"):
        # What convmem made before it erased snapshots for good: nats-py's KV API denies message
        # deletes, and NATS cannot turn that off. The bucket holds only snapshots, a cache that
        # sessions rebuild from the log, so it is made anew rather than refused.
        _log.warning(
            "key-value bucket %r denies message deletes (made by an earlier convmem): replacing it, "
            "its snapshots are rebuilt from the log",
            bucket,
        )
        try:
            await setup_request(conn, f"$JS.API.STREAM.DELETE.{stream}")
        except nats.js.errors.APIError as exc:
            if exc.err_code != 10059:  # 10059: another process deleted it meanwhile
                raise
        await create_stream(conn, bucket_config(bucket, replicas=replicas))  # or another made it meanwhile


async def check_exists(conn: NatsConnection, stream: str) -> bool:
    """Whether the stream exists (never creates it: for read-only use)."""
    return await stream_config_of(conn, stream) is not None


def open_bucket(
    conn: NatsConnection, bucket: str, *, replicas: int, create: bool, what: str, missing: str
) -> None:
    """Create or check the key-value `bucket` (`create`), or only find it: a missing one is `StoreNotFound`.

    `what` names the bucket in the errors of the calls ("bucket"), `missing` in `StoreNotFound`.
    """
    if create:
        conn.call(
            lambda: ensure_bucket(conn, bucket, replicas=replicas),
            what=f"checking {what} {bucket!r}",
            timeout=setup_wait(conn),
        )
    elif not conn.call(
        lambda: check_exists(conn, f"KV_{bucket}"),
        what=f"finding {what} {bucket!r}",
        timeout=setup_wait(conn),
    ):
        raise StoreNotFound(f"the NATS server has no {missing} {bucket!r}", name=bucket)


async def stream_info_of(conn: NatsConnection, name: str) -> dict[str, Any] | None:
    """The stream `name`'s `STREAM.INFO` (its config and state); None when it does not exist."""
    try:
        info: dict[str, Any] = await setup_request(conn, f"$JS.API.STREAM.INFO.{name}")
    except nats.js.errors.APIError as exc:
        if exc.err_code == 10059:  # stream not found
            return None
        raise
    return info


async def stream_config_of(conn: NatsConnection, name: str) -> dict[str, Any] | None:
    info = await stream_info_of(conn, name)
    if info is None:
        return None
    config: dict[str, Any] = info["config"]
    return config


def _compare(what: str, wanted: dict[str, Any], found: dict[str, Any], *, ignore: set[str]) -> None:
    defaults: dict[str, Any] = {"allow_direct": False, "allow_atomic": False, "deny_purge": False}
    # The replica count is the operator's to scale (nats stream edit --replicas); an existing
    # stream or bucket is used with the count it has, so readers need not know it.
    problems = [
        f"{field} is {found.get(field, defaults.get(field))!r}, convmem needs {value!r}"
        for field, value in wanted.items()
        if field not in ignore | {"num_replicas"} and found.get(field, defaults.get(field)) != value
    ]
    if found.get("sealed"):
        problems.append("it is sealed")
    if problems:
        raise InvalidConfig(
            "stream",
            f"the existing {what} does not match: {'; '.join(problems)}. convmem never changes an "
            "existing stream; use another name, or update or delete it yourself (nats stream edit)",
        )
