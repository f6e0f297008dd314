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

`scrub` is the one redaction: it hides every credential in any text (the user
information of URLs, given passwords and tokens, nkey seeds, JWTs), so no log
line, error, status output or ready file shows one; `redact_url` is `scrub`
of a URL with its own secrets (``nats://user:***@host``).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec

from convmem.errors import InvalidConfig

__all__ = ["NATS_URL_ENV", "NatsAuth", "redact_url", "scrub", "url_secrets"]

NATS_URL_ENV = "NATS_URL"
MASK = "***"

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

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f}={MASK if f in ('password', 'token') else repr(v)}"
            for f in self.__struct_fields__
            if (v := getattr(self, f)) is not None
        )
        return f"NatsAuth({shown})"

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
    """The passwords and tokens written in a URL or comma-separated URLs, with or without a scheme.

    A password may hold any character (``@``, ``:``, ``/``, ``,``): the user
    information runs to the last ``@`` of its URL, and the password from the
    first ``:`` after the user. The percent-decoded form is a secret too.
    """
    if not url:
        return ()
    pieces = _SCHEME_SPLIT.split(url) if "://" in url else url.split(",")
    if "," in url and url.count("://") <= 1:
        pieces.append(url)  # one URL whose password holds a comma
    found: list[str] = []
    for piece in pieces:
        rest = piece.strip().partition("://")[2] if "://" in piece else piece.strip()
        info = rest.rpartition("@")[0]
        if not info:
            continue
        _user, sep, password = info.partition(":")
        secret = password if sep else info  # nats://TOKEN@host
        found.extend(s for s in (secret, unquote(secret)) if s)
    return tuple(dict.fromkeys(found))


def redact_url(url: str) -> str:
    """`url` (or comma-separated URLs, with or without a scheme) with its password or token as ``***``.

    ``nats://user:***@host:4222``; the same as ``scrub(url, url_secrets(url))``.
    """
    return scrub(url, url_secrets(url))


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential in it replaced by ``***``: the one redaction of every output path.

    Hidden whole, whatever characters they hold: the user information of
    every URL with a scheme (``nats://user:***@host``, ``nats://***@host``),
    each of `secrets` (a password or token from the command line, the
    environment or a URL without a scheme: `url_secrets`), and anything that
    reads as a credentials file's contents: nkey seeds (``SU...``) and JWTs.
    """
    text = _URL.sub(_hide_userinfo, text)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _SEED.sub(MASK, text)
    return _JWT.sub(MASK, text)


_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
_SCHEME_SPLIT = re.compile(rf",(?=\s*{_SCHEME})")
_URL = re.compile(rf"(?P<scheme>{_SCHEME})(?P<rest>[^\s,]*(?:,(?!\s*{_SCHEME})[^\s,]*)*)")
"""A URL with a scheme, to the first blank or the comma before the next URL (a password may hold one)."""
_SEED = re.compile(r"\bS[A-Z][A-Z2-7]{50,}\b")
"""An nkey seed: ``S``, its kind (``U`` user, ``A`` account, ``O`` operator...), then base32."""
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]+")
"""A JWT (a credentials file holds the user's JWT beside its seed)."""


def _hide_userinfo(match: re.Match[str]) -> str:
    rest = match.group("rest")
    info, at, host = rest.rpartition("@")
    if not at:
        return match.group()
    user, sep, _password = info.partition(":")
    return f"{match.group('scheme')}{user}:{MASK}@{host}" if sep else f"{match.group('scheme')}{MASK}@{host}"
