"""The status of every replica of the service: found with the NATS micro-services protocol, asked one by one.

``$SRV.PING.convmem`` is answered by every running `MemoryService` (it is a
micro-service named ``convmem``, so `nats micro ls` lists it too); each one
found is then asked for its own health and metrics on
``{api_prefix}.ops.status.{instance}``. A replica that answers the ping but
not its status in time (its log hangs, its workers are stuck) is reported as
silent, and with `expect` so is a replica that does not answer at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from convmem.adapters._auth import NatsAuth, redact_url, scrub, url_secrets
from convmem.adapters.backends.jetstream import close_quietly, server_list
from convmem.adapters.frontends.service._inboxes import OPERATOR_INBOX
from convmem.adapters.frontends.service._protocol import MICRO_NAME, status_subject
from convmem.errors import LogUnavailable

__all__ = ["ReplicaStatus", "service_status"]


class ReplicaStatus(msgspec.Struct, kw_only=True):
    """One replica: its instance id and what it said (`health`, `metrics`), or why it said nothing."""

    instance: str
    health: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.health is not None and self.health.get("status") == "ok"


async def service_status(
    url: str,
    *,
    auth: NatsAuth | None = None,
    api_prefix: str,
    timeout: float = 5.0,
    discover: float = 0.5,
    only: Sequence[str] | None = None,
) -> list[ReplicaStatus]:
    """Every replica that answers ``$SRV.PING.convmem`` within `discover` seconds (or just those in `only`),
    asked; each worker of a `convmem serve --workers` is a replica of its own."""
    auth = auth or NatsAuth()
    secrets = (*url_secrets(url), *auth.secrets)
    try:
        nc = await asyncio.wait_for(
            nats.connect(
                servers=server_list(url),
                connect_timeout=max(1, int(timeout)),
                allow_reconnect=False,
                **{**auth.options(), "inbox_prefix": OPERATOR_INBOX},  # where the service answers operators
            ),
            timeout + 1.0,
        )
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        detail = scrub(str(exc) or type(exc).__name__, secrets)
        raise LogUnavailable(f"cannot connect to NATS at {redact_url(url)} ({detail})") from None
    try:
        instances = list(only) if only is not None else await _ping(nc, discover)
        return list(await asyncio.gather(*(_ask(nc, api_prefix, i, timeout) for i in sorted(instances))))
    finally:
        await close_quietly(nc)


async def _ping(nc: Client, wait: float) -> list[str]:
    found: list[str] = []
    inbox = nc.new_inbox()

    async def on_reply(msg: Msg) -> None:
        try:
            ping: Mapping[str, Any] = json.loads(msg.data)
        except ValueError:
            return
        if ping.get("name") == MICRO_NAME and isinstance(ping.get("id"), str):
            found.append(str(ping.get("metadata", {}).get("instance") or ping["id"]))

    subscription = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(f"$SRV.PING.{MICRO_NAME}", b"", reply=inbox)
        await nc.flush()
        await asyncio.sleep(wait)  # replies from every replica come within this window
    finally:
        await subscription.unsubscribe()
    return found


async def _ask(nc: Client, api_prefix: str, instance: str, timeout: float) -> ReplicaStatus:
    try:
        reply = await nc.request(status_subject(api_prefix, instance), b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        return ReplicaStatus(instance=instance, problem="not running (no responder)")
    except (TimeoutError, nats.errors.Error):
        return ReplicaStatus(instance=instance, problem=f"silent: no status within {timeout:g}s")
    headers = reply.headers or {}
    if "Nats-Service-Error" in headers:
        return ReplicaStatus(instance=instance, problem=f"unhealthy: {headers['Nats-Service-Error']}")
    try:
        body = json.loads(reply.data)
    except ValueError:
        return ReplicaStatus(instance=instance, problem="answered something that is not a status")
    return ReplicaStatus(instance=instance, health=body.get("health"), metrics=body.get("metrics"))
