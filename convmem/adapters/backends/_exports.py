"""`FileExportRegistry`: the export files convmem wrote on this machine, so an erasure reaches them.

``convmem export -o FILE`` records the file it wrote here: its absolute path
and, for each session and each user it holds, a BLAKE2b digest keyed with a
salt of the entry's own (no id in clear, as erasure notices and receipts).
An erasure's ``exports`` step (`ExportRegistry.erase_copies`) then rewrites
every recorded file that holds the erased sessions without their lines
(written beside it, then renamed over it), removes a file left empty, and
forgets an entry whose file is gone.

The registry is one JSON file, ``$CONVMEM_EXPORTS`` or
``$XDG_STATE_HOME/convmem/exports.json`` (``~/.local/state/convmem/exports.json``):
a per-user file outside any store, so reading commands never write to a
store or its data folder. It only knows what was written on this machine by
this user with ``-o``: an export to stdout, a file copied or moved elsewhere,
or one written on another machine is outside convmem's reach. Erasing reads
the registry and never creates it.

Each entry carries ``sum``, a digest of its own fields: a flipped byte that
leaves the file valid JSON (a letter of a path or a digest changing case)
would otherwise make an erasure miss that export and forget its entry as a
file that is gone, reported done with the user's lines still in it. An entry
whose ``sum`` does not match, or that has a field no entry has, makes the
registry damaged: `InvalidInput` naming the registry file and the entry, so
an erasure fails (``convmem erase``: exit 5) and stays pending until the file
is fixed or removed and ``convmem erase --resume`` runs. An entry without
``sum`` (a registry of an earlier version) is read as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

if sys.platform != "win32":
    import fcntl

from convmem.actors import ErasureRequest
from convmem.errors import InvalidInput
from convmem.events import MemoryKey

__all__ = ["FileExportRegistry", "default_export_registry"]

_DIGEST_BYTES = 16
_encode_parts = msgspec.msgpack.Encoder().encode
_FIX = (
    "; fix or remove the registry file (the export files it lists are then out of an erasure's reach:"
    " delete them or export again), then run convmem erase --resume for a pending erasure"
)
_LOCK = threading.Lock()  # one process's writers of a registry (other processes: `_locked`'s file lock)


def _digest(salt: bytes, *parts: str) -> str:
    return hashlib.blake2b(_encode_parts(parts), key=salt, digest_size=_DIGEST_BYTES).hexdigest()


def default_export_registry() -> FileExportRegistry:
    """The registry of this user on this machine (``$CONVMEM_EXPORTS`` overrides where it is)."""
    given = os.environ.get("CONVMEM_EXPORTS")
    if given:
        return FileExportRegistry(Path(given))
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return FileExportRegistry(Path(state) / "convmem" / "exports.json")


class _Entry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    salt: str
    sessions: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    sum: str = ""  # `_entry_sum` of the fields above; "" in a registry written before it existed

    def intact(self) -> bool:
        return not self.sum or self.sum == _entry_sum(self.path, self.salt, self.sessions, self.users)

    def holds(self, request: ErasureRequest) -> bool:
        salt = bytes.fromhex(self.salt)
        key = request.key
        if key is None:
            return _digest(salt, request.tenant_id, request.user_id) in self.users
        return _digest(salt, key.tenant_id, key.user_id, key.session_id) in self.sessions


def _entry_sum(path: str, salt: str, sessions: tuple[str, ...], users: tuple[str, ...]) -> str:
    return hashlib.blake2b(
        _encode_parts((path, salt, sessions, users)), digest_size=_DIGEST_BYTES
    ).hexdigest()


def _entry(path: Path, keys: Iterable[MemoryKey]) -> _Entry:
    salt = os.urandom(16).hex()
    found = set(keys)
    raw = bytes.fromhex(salt)
    sessions = tuple(sorted(_digest(raw, k.tenant_id, k.user_id, k.session_id) for k in found))
    users = tuple(sorted({_digest(raw, k.tenant_id, k.user_id) for k in found}))
    return _Entry(
        path=str(path),
        salt=salt,
        sessions=sessions,
        users=users,
        sum=_entry_sum(str(path), salt, sessions, users),
    )


class FileExportRegistry:
    """The `ExportRegistry` of one JSON file (see the module's doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> list[_Entry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            entries = msgspec.json.decode(raw, type=list[_Entry])
        except msgspec.DecodeError as exc:
            raise InvalidInput(str(self.path), f"is not convmem's export registry: {exc}{_FIX}") from None
        for number, entry in enumerate(entries, start=1):
            problem = None if entry.intact() else "fails its checksum (a changed or damaged byte)"
            if problem is None:
                try:
                    bytes.fromhex(entry.salt)
                except ValueError:
                    problem = "has a salt that is not hex"
            if problem is not None:
                raise InvalidInput(
                    str(self.path),
                    f"export registry entry {number} (export file {entry.path!r}) {problem}{_FIX}",
                )
        return entries

    def _write(self, entries: list[_Entry]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(msgspec.json.encode(entries))
        os.replace(temporary, self.path)

    @contextlib.contextmanager
    def _locked(self, *, create: bool = False) -> Iterator[None]:
        """This registry held against every other writer: this process's threads, and other processes
        through a lock file beside it (an export and an erasure in two processes each read, changed
        and wrote the list: the last writer dropped the other's change, and an export's entry lost so
        would never be rewritten by a later erasure). Without `create`, a registry that does not
        exist is not made (nor its folder or lock file): there is nothing in it to read."""
        with _LOCK:
            if sys.platform == "win32" or not (create or self.path.exists()):
                yield
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(f".{self.path.name}.lock"), "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, path: Path, keys: Iterable[MemoryKey]) -> None:
        """Remember that the export file `path` holds the sessions `keys`."""
        entry = _entry(path.resolve(), keys)
        with self._locked(create=True):
            entries = [e for e in self._read() if e.path != entry.path]
            self._write([*entries, entry])

    def files(self) -> list[str]:
        """The recorded export files (absolute paths)."""
        with self._locked():
            return [e.path for e in self._read()]

    def holds(self, request: ErasureRequest) -> bool:
        """Whether a recorded file holds a session of `request` (`ExportLookup`)."""
        with self._locked():
            return any(entry.holds(request) for entry in self._read())

    def erase_copies(self, request: ErasureRequest) -> int:
        """See `ExportRegistry`: the request's sessions leave every recorded file; returns files changed."""
        with self._locked():
            entries = self._read()
            if not entries:
                return 0
            kept: list[_Entry] = []
            changed = 0
            for entry in entries:
                if not entry.holds(request):
                    kept.append(entry)
                    continue
                remaining = _rewrite(Path(entry.path), request)
                changed += 1
                if remaining:
                    kept.append(_entry(Path(entry.path), remaining))
            if changed:
                self._write(kept)
            return changed


def _rewrite(path: Path, request: ErasureRequest) -> set[MemoryKey]:
    """Drop the request's sessions' lines from the export at `path`; the keys left (none: file removed)."""
    try:
        # Bytes that are not UTF-8 (an edited copy) are kept as they are, not a reason to fail the erasure.
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(keepends=True)
    except FileNotFoundError:
        return set()  # moved or removed: out of reach, forgotten
    left: list[str] = []
    keys: set[MemoryKey] = set()
    for line in lines:
        key = _key_of(line)
        if key is not None and request.covers(key):
            continue
        left.append(line)
        if key is not None:
            keys.add(key)
    if not keys:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return set()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.erasing")
    temporary.write_text("".join(left), encoding="utf-8", errors="surrogateescape")
    os.replace(temporary, path)
    return keys


def _key_of(line: str) -> MemoryKey | None:
    try:
        return msgspec.convert(json.loads(line)["key"], MemoryKey)
    except (ValueError, KeyError, TypeError, msgspec.ValidationError, RecursionError):
        return None
