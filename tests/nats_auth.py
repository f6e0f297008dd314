"""Real credentials for real nats-servers in tests: TLS certificates, nkeys, and JWT credentials files.

Everything is generated in the test's own folder with the `cryptography` and
`nkeys` packages; nothing is fetched, and no key outlives the test.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import time
from pathlib import Path

import msgspec
import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["Creds", "Nkey", "TlsFiles", "make_creds", "make_nkey", "make_tls"]


class TlsFiles(msgspec.Struct, frozen=True):
    """A CA, a server certificate for 127.0.0.1, and a client certificate, as PEM files."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    def server_block(self) -> str:
        """The server's ``tls`` block: its certificate, and client certificates required."""
        return (
            f'tls {{\n  cert_file: "{self.server_cert}"\n  key_file: "{self.server_key}"\n'
            f'  ca_file: "{self.ca}"\n  verify: true\n  timeout: 5\n}}\n'
        )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> str:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(path)


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_tls(folder: Path) -> TlsFiles:
    """A throwaway CA and the certificates a TLS server requiring client certificates needs."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert("convmem test CA", ca_key, None, ca_key, ca=True)
    files: dict[str, str] = {}
    (folder / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["ca"] = str(folder / "ca.pem")
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"convmem test {role}", key, ca_cert.subject, ca_key, ca=False, server=role == "server")
        (folder / f"{role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{role}_cert"] = str(folder / f"{role}.pem")
        files[f"{role}_key"] = _write_key(folder / f"{role}-key.pem", key)
    return TlsFiles(**files)


class Nkey(msgspec.Struct, frozen=True):
    """An nkey: its seed (the secret) and its public key."""

    seed: str
    public: str

    def sign(self, data: bytes) -> bytes:
        signed: bytes = nkeys.from_seed(self.seed.encode()).sign(data)
        return signed


def make_nkey(prefix: int = nkeys.PREFIX_BYTE_USER) -> Nkey:
    """A fresh nkey of a kind (user by default)."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    public = nkeys.from_seed(seed).public_key.decode()
    return Nkey(seed=seed.decode(), public=public)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(claims: dict[str, object], signer: Nkey) -> str:
    claims = {**claims, "iat": int(time.time()), "iss": signer.public}
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(signer.sign(f'{head}.{body}'.encode()))}"


class Creds(msgspec.Struct, frozen=True):
    """An operator-mode server configuration and a user's credentials file for it."""

    server_config: str
    creds_file: str
    user_seed: str


def make_creds(folder: Path) -> Creds:
    """An operator, an account with JetStream, and a user of it: the server block and the creds file."""
    folder.mkdir(parents=True, exist_ok=True)
    operator = make_nkey(nkeys.PREFIX_BYTE_OPERATOR)
    account = make_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    user = make_nkey(nkeys.PREFIX_BYTE_USER)
    system = make_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    operator_jwt = _jwt(
        {"sub": operator.public, "name": "op", "nats": {"type": "operator", "version": 2}}, operator
    )
    unlimited = dict.fromkeys(("subs", "data", "payload", "imports", "exports", "conn", "leaf"), -1)
    jetstream = dict.fromkeys(("mem_storage", "disk_storage", "streams", "consumer"), -1)
    limits = {**unlimited, **jetstream, "wildcards": True}
    account_jwt = _jwt(
        {
            "sub": account.public,
            "name": "convmem",
            "nats": {
                "limits": limits,
                "type": "account",
                "version": 2,
            },
        },
        operator,
    )
    system_jwt = _jwt(
        {"sub": system.public, "name": "SYS", "nats": {"limits": unlimited, "type": "account", "version": 2}},
        operator,
    )
    user_jwt = _jwt(
        {
            "sub": user.public,
            "name": "planner",
            "nats": {
                "pub": {},
                "sub": {},
                "subs": -1,
                "data": -1,
                "payload": -1,
                "type": "user",
                "version": 2,
            },
        },
        account,
    )
    creds = folder / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n",
        encoding="utf-8",
    )
    config = (
        f"operator: {operator_jwt}\nsystem_account: {system.public}\nresolver: MEMORY\n"
        f"resolver_preload: {{\n  {account.public}: {account_jwt}\n  {system.public}: {system_jwt}\n}}\n"
    )
    return Creds(server_config=config, creds_file=str(creds), user_seed=user.seed)
