"""How convmem authenticates to NATS and secures the connection, and how it keeps secrets unprinted.

`NatsAuth` holds what the nats CLI takes: a credentials file (``--creds``),
an nkey seed file (``--nkey``), TLS files (``--tlsca``, ``--tlscert``,
``--tlskey``), a user and password or a token, and the inbox prefix
(``--inbox-prefix``); `NatsAuth.from_env` reads the same settings from the
nats CLI's variables (``NATS_CREDS``, ``NATS_NKEY``, ``NATS_CA``,
``NATS_CERT``, ``NATS_KEY``, ``NATS_USER``, ``NATS_PASSWORD``,
``NATS_TOKEN``, ``NATS_INBOX_PREFIX``). `options()` turns it into nats-py's
``connect`` keywords, checking every file first so a missing one is a clear
error naming it.

`redact_url` hides the password (or token) of a URL: ``nats://user:***@host``.
`scrub` hides every secret of a URL and of a `NatsAuth` in any text, so no
log line, error or status output shows one.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from convmem.errors import InvalidConfig

__all__ = ["NATS_URL_ENV", "NatsAuth", "redact_url", "scrub", "url_secrets"]

NATS_URL_ENV = "NATS_URL"
MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[a-z]+://)(?P<info>[^@/\s,]+)@", re.IGNORECASE)

_ENV = {
    "creds": "NATS_CREDS",
    "nkey": "NATS_NKEY",
    "tls_ca": "NATS_CA",
    "tls_cert": "NATS_CERT",
    "tls_key": "NATS_KEY",
    "user": "NATS_USER",
    "password": "NATS_PASSWORD",
    "token": "NATS_TOKEN",
    "inbox_prefix": "NATS_INBOX_PREFIX",
}


class NatsAuth(msgspec.Struct, frozen=True, kw_only=True):
    """Credentials and TLS for a NATS connection (every field optional; see the module docstring)."""

    creds: str | None = None
    """A credentials file: the user's JWT and nkey seed (decentralised auth)."""
    nkey: str | None = None
    """An nkey seed file (a user configured by its public nkey)."""
    tls_ca: str | None = None
    """The CA certificate(s) the server's certificate must chain to."""
    tls_cert: str | None = None
    """The client certificate, for servers that verify clients (with `tls_key`)."""
    tls_key: str | None = None
    """The client certificate's private key."""
    user: str | None = None
    password: str | None = None
    token: str | None = None
    inbox_prefix: str | None = None
    """Where replies come back (say ``_INBOX_auditor``): users may be confined to their own inboxes."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NatsAuth:
        """The settings of the nats CLI's environment variables (unset or empty ones are None)."""
        env = os.environ if environ is None else environ
        return cls(**{field: env.get(name) or None for field, name in _ENV.items()})

    def merged(self, other: NatsAuth) -> NatsAuth:
        """These settings, with `other`'s where this one has none."""
        fields = {f: getattr(self, f) or getattr(other, f) for f in self.__struct_fields__}
        return NatsAuth(**fields)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values never to print."""
        return tuple(s for s in (self.password, self.token) if s)

    def options(self) -> dict[str, Any]:
        """nats-py ``connect`` keywords; `InvalidConfig` naming a file that cannot be read."""
        options: dict[str, Any] = {}
        if self.creds:
            options["user_credentials"] = _readable("creds", self.creds)
        if self.nkey:
            options["nkeys_seed"] = _readable("nkey", self.nkey)
        if self.user:
            options["user"] = self.user
        if self.password:
            options["password"] = self.password
        if self.token:
            options["token"] = self.token
        if self.inbox_prefix:
            options["inbox_prefix"] = self.inbox_prefix
        if self.tls_ca or self.tls_cert or self.tls_key:
            options["tls"] = self.tls_context()
        return options

    def tls_context(self) -> ssl.SSLContext:
        """A TLS context that checks the server against `tls_ca` (else the system CAs), with client cert."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidConfig("tls", "a client certificate needs both --tlscert and --tlskey")
        ca = _readable("tlsca", self.tls_ca) if self.tls_ca else None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
            if self.tls_cert and self.tls_key:
                context.load_cert_chain(
                    _readable("tlscert", self.tls_cert), _readable("tlskey", self.tls_key)
                )
        except ssl.SSLError as exc:
            raise InvalidConfig("tls", f"the TLS files cannot be used: {exc.reason or exc}") from None
        return context


def _readable(field: str, path: str) -> str:
    try:
        with Path(path).open("rb"):
            pass
    except OSError as exc:
        raise InvalidConfig(field, f"cannot read {path}: {exc.strerror}") from None
    return path


def url_secrets(url: str | None) -> tuple[str, ...]:
    """The passwords and tokens written in a URL (or comma-separated URLs)."""
    if not url:
        return ()
    found: list[str] = []
    for part in url.split(","):
        try:
            parts = urlsplit(part.strip())
        except ValueError:
            continue
        if parts.password:
            found.append(parts.password)
        elif parts.username and "@" in part:
            found.append(parts.username)  # nats://TOKEN@host
    return tuple(found)


def redact_url(url: str) -> str:
    """`url` with its password (or token) shown as ``***``: ``nats://user:***@host:4222``."""

    def hide(match: re.Match[str]) -> str:
        user, sep, _password = match.group("info").partition(":")
        return f"{match.group('scheme')}{user}:{MASK}@" if sep else f"{match.group('scheme')}{MASK}@"

    return _USERINFO.sub(hide, url)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every URL's password and every one of `secrets` replaced by ``***``."""
    text = redact_url(text)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
