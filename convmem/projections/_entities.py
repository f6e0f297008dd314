"""Entity tracking for the entity memory: mention counts, attributes, eviction.

Pure and deterministic: a table is folded from mentions in order; a new
entity arriving when the table is full evicts the least mentioned one (the
one mentioned longest ago among equals).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from convmem.errors import InvalidInput
from convmem.events import EntityMention

__all__ = ["ENTITY_HEADER", "EntityRecord", "EntityTable", "parse_entities", "track_entities"]

ENTITY_HEADER = "Entities mentioned in this conversation (most mentioned first):"


class EntityRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a memory knows about one entity."""

    name: str
    kind: str | None = None
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    mentions: int = 0
    last_mention: int = 0
    """Number of the entity's latest mention among all mentions tracked (orders evictions)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "attributes": dict(self.attributes),
            "mentions": self.mentions,
        }


def _entity_key(name: str) -> str:
    return name.strip().casefold()


class EntityTable(msgspec.Struct, frozen=True, kw_only=True):
    """Tracked entities in first-mention order, and how many mentions were tracked in all."""

    entities: tuple[EntityRecord, ...] = ()
    mention_total: int = 0

    def get(self, name: str) -> dict[str, Any] | None:
        """The entity called `name` (case and surrounding blanks ignored), or None."""
        wanted = _entity_key(name)
        found = next((e for e in self.entities if _entity_key(e.name) == wanted), None)
        return None if found is None else found.to_dict()

    def summary(self) -> str:
        """The entity summary the memory shows as a system message ('' when empty)."""
        if not self.entities:
            return ""
        lines = [ENTITY_HEADER]
        for e in sorted(self.entities, key=lambda e: (-e.mentions, -e.last_mention)):
            kind = f" ({e.kind})" if e.kind else ""
            times = "once" if e.mentions == 1 else f"{e.mentions} times"
            facts = "".join(f"; {k}: {v}" for k, v in sorted(e.attributes.items()))
            lines.append(f"- {e.name}{kind}, mentioned {times}{facts}")
        return "\n".join(lines)


def track_entities(table: EntityTable, mentions: Iterable[EntityMention], max_entities: int) -> EntityTable:
    """Count `mentions` into `table`, merging attributes (later values win).

    A new entity arriving when `max_entities` are tracked evicts the least
    mentioned one; among equals, the one whose last mention is oldest.
    """
    records = {_entity_key(e.name): e for e in table.entities}
    total = table.mention_total
    for mention in mentions:
        total += 1
        key = _entity_key(mention.name)
        old = records.get(key)
        if old is None:
            if len(records) >= max_entities:
                victim = min(records, key=lambda k: (records[k].mentions, records[k].last_mention))
                del records[victim]
            old = EntityRecord(name=mention.name.strip())
        records[key] = EntityRecord(
            name=old.name,
            kind=mention.kind or old.kind,
            attributes={**old.attributes, **mention.attributes},
            mentions=old.mentions + 1,
            last_mention=total,
        )
    return EntityTable(entities=tuple(records.values()), mention_total=total)


def parse_entities(value: object) -> tuple[EntityMention, ...]:
    """``metadata["entities"]``: a list of names, or of ``{name, kind?, attributes?}`` mappings."""
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidInput("entities", "must be a list of names or of {name, kind?, attributes?} mappings")
    out: list[EntityMention] = []
    for i, entry in enumerate(value):
        where = f"entities[{i}]"
        spec: object = {"name": entry} if isinstance(entry, str) else entry
        if not isinstance(spec, Mapping):
            raise InvalidInput(where, f"must be a name or a mapping, got {type(entry).__name__}")
        if extra := set(spec) - {"name", "kind", "attributes"}:
            raise InvalidInput(where, f"unknown keys {sorted(map(str, extra))}")
        name, kind, attributes = spec.get("name"), spec.get("kind"), spec.get("attributes") or {}
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(f"{where}.name", f"must be a non-blank string, got {name!r}")
        if kind is not None and not isinstance(kind, str):
            raise InvalidInput(f"{where}.kind", f"must be a string or None, got {kind!r}")
        if not isinstance(attributes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
        ):
            raise InvalidInput(f"{where}.attributes", "must map strings to strings")
        out.append(EntityMention(name=name, kind=kind, attributes=dict(attributes)))
    return tuple(out)
