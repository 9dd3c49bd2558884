"""The ``icelog.*`` table properties the commit core reads: key, type, default and bounds, in one place.

A malformed value is refused when icelog sets it (:func:`validate`, e.g. ``LogTable.create``)
and again whenever a commit reads it (:func:`read`, before anything is written): a value set
by another tool must never make a commit land and then fail, nor silently turn a safeguard
off (``icelog.commit-ids.keep=0`` once kept every id, ``-5`` none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from storage.errors import InvalidProperty

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class IntProperty:
    """An integer table property with inclusive bounds."""

    key: str
    default: int
    minimum: int
    maximum: int = INT64_MAX

    def parse(self, raw: str, table: str | None = None) -> int:
        """The value of ``raw``, or :class:`InvalidProperty` (``60s``, ``1e3``, ``-5``, ``0`` where 1 is the least)."""
        if not isinstance(raw, str) or not re.fullmatch(r"-?[0-9]{1,19}", raw.strip()):
            raise InvalidProperty(table=table, key=self.key, value=str(raw), reason=f"must be a whole number in {self.bounds()}")
        value = int(raw)
        if not self.minimum <= value <= self.maximum:
            raise InvalidProperty(table=table, key=self.key, value=str(raw), reason=f"must be in {self.bounds()}")
        return value

    def bounds(self) -> str:
        return f"{self.minimum}..{self.maximum}" if self.maximum != INT64_MAX else f"{self.minimum} or more"


SNAPSHOTS_KEEP = IntProperty("icelog.snapshots.keep", 20, minimum=1)
COMMIT_IDS_KEEP = IntProperty("icelog.commit-ids.keep", 1000, minimum=1)
COMMIT_IDS_MIN_RETENTION_MS = IntProperty("icelog.commit-ids.min-retention-ms", 7 * 24 * 3600 * 1000, minimum=0)
METADATA_DELETE_GRACE_MS = IntProperty("icelog.metadata.delete-grace-ms", 60_000, minimum=0)

KNOWN = {p.key: p for p in (SNAPSHOTS_KEEP, COMMIT_IDS_KEEP, COMMIT_IDS_MIN_RETENTION_MS, METADATA_DELETE_GRACE_MS)}


def read(properties: Mapping[str, str], prop: IntProperty, table: str | None = None) -> int:
    """``prop``'s value in a table's ``properties`` (its default when unset).

    Raises:
        InvalidProperty: the value is malformed or out of bounds.
    """
    raw = properties.get(prop.key)
    return prop.default if raw is None else prop.parse(raw, table)


@dataclass(frozen=True)
class CommitSettings:
    """What the commit core reads from a table's properties, read once before it writes anything."""

    snapshots_keep: int
    commit_ids_keep: int
    commit_ids_min_retention_ms: int
    metadata_grace_ms: int

    @classmethod
    def of(cls, properties: Mapping[str, str], table: str | None = None) -> CommitSettings:
        return cls(
            snapshots_keep=read(properties, SNAPSHOTS_KEEP, table),
            commit_ids_keep=read(properties, COMMIT_IDS_KEEP, table),
            commit_ids_min_retention_ms=read(properties, COMMIT_IDS_MIN_RETENTION_MS, table),
            metadata_grace_ms=read(properties, METADATA_DELETE_GRACE_MS, table),
        )


def validate(properties: Mapping[str, str], table: str | None = None) -> None:
    """Refuse any malformed value of a known key among ``properties`` (at set time).

    Raises:
        InvalidProperty: the first malformed value.
    """
    for key, raw in properties.items():
        if key in KNOWN:
            KNOWN[key].parse(raw, table)
