"""Every ``icelog.*`` table property: the knobs users set (key, type, default, bounds) and the
keys icelog keeps its own state in, in one place.

A malformed value is refused when icelog sets it (:func:`validate`, e.g. ``LogTable.create``)
and again whenever a commit reads it (:func:`read`, before anything is written): a value set
by another tool must never make a commit land and then fail, nor silently turn a safeguard
off (``icelog.commit-ids.keep=0`` once kept every id, ``-5`` none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from icelog.storage.errors import InvalidProperty, UnknownProperty

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class IntProperty:
    """An integer table property with inclusive bounds."""

    key: str
    default: int | None  # None: unset means "no limit"
    minimum: int
    maximum: int = INT64_MAX

    def parse(self, raw: str, table: str | None = None) -> int:
        """The value of ``raw``, or :class:`InvalidProperty` (``60s``, ``1e3``, ``-5``, ``0`` where 1 is the least)."""
        if not isinstance(raw, str) or not re.fullmatch(r"-?[0-9]{1,19}", raw.strip()):
            raise InvalidProperty(table=table, key=self.key, value=str(raw), reason=f"must be a whole number, {self.bounds()}")
        value = int(raw)
        if not self.minimum <= value <= self.maximum:
            raise InvalidProperty(table=table, key=self.key, value=str(raw), reason=f"must be {self.bounds()}")
        return value

    def bounds(self) -> str:
        return f"in {self.minimum}..{self.maximum}" if self.maximum != INT64_MAX else f"{self.minimum} or more"


SNAPSHOTS_KEEP = IntProperty("icelog.snapshots.keep", 20, minimum=1)
COMMIT_IDS_KEEP = IntProperty("icelog.commit-ids.keep", 1000, minimum=1)
COMMIT_IDS_MIN_RETENTION_MS = IntProperty("icelog.commit-ids.min-retention-ms", 7 * 24 * 3600 * 1000, minimum=0)
METADATA_DELETE_GRACE_MS = IntProperty("icelog.metadata.delete-grace-ms", 60_000, minimum=0)

RETENTION_MS = IntProperty("icelog.retention.ms", None, minimum=1)
RETENTION_BYTES = IntProperty("icelog.retention.bytes", None, minimum=1)
PRODUCER_EXPIRY_MS = IntProperty("icelog.producer.expiry-ms", 7 * 24 * 3600 * 1000, minimum=1)
TRANSACTION_TIMEOUT_MS = IntProperty("icelog.transaction.timeout-ms", 60_000, minimum=1)
GROUP_MAX_RANGES = IntProperty("icelog.groups.max-ranges", 1000, minimum=1)

KNOWN = {
    p.key: p
    for p in (
        SNAPSHOTS_KEEP,
        COMMIT_IDS_KEEP,
        COMMIT_IDS_MIN_RETENTION_MS,
        METADATA_DELETE_GRACE_MS,
        RETENTION_MS,
        RETENTION_BYTES,
        PRODUCER_EXPIRY_MS,
        TRANSACTION_TIMEOUT_MS,
        GROUP_MAX_RANGES,
    )
}

# Knobs that are not integers.
KEY_COLUMN = "icelog.key-column"  # the payload column whose hash is log_key_hash (default "key")
CHECK_EXPECTED_OFFSETS = "icelog.check-expected-offsets"  # "true": every append must name its offsets

# icelog's own state, written by its commits only (a hand-set value is a foreign change).
FORMAT = "icelog.format"  # marks a log table
VERSION = "icelog.version"  # bumped by every commit: the compare-and-swap's witness
HEAD = "icelog.head"  # the snapshot icelog's last commit left current
COMMITS = "icelog.commits"  # the commit-id registry's newest entries (storage.core.registry)
COMMIT_FILES = "icelog.commits.files"  # its older entries' files
COMMIT_ID = "icelog.commit-id"  # in a snapshot's summary
RANGES = "icelog.ranges"  # in a snapshot's summary: the offsets it added
FORGOTTEN = "icelog.commits.forgotten-ms"  # the newest commit time the registry dropped
LEASE = "icelog.lease"  # "<commit id> <expiry, epoch ms>"
READ_ONLY = "icelog.read-only"  # a mirror target
PARTITIONS = "icelog.partitions"
WATERMARKS = "icelog.watermarks"
PRODUCERS = "icelog.producers"  # idempotent producers' epochs and sequences
NEXT_PRODUCER_ID = "icelog.next-producer-id"
TRANSACTIONS = "icelog.transactions"  # the coordinator's state, on the journal
TXN_ID = "icelog.txn-id"  # in a snapshot's summary
GROUP_OFFSETS = "icelog.group-offsets"
GROUP_RANGES = "icelog.group-ranges"
GROUP_MEMBERS = "icelog.group-members"
ACLS = "icelog.acls"
MIRROR = "icelog.mirror"  # JSON: {"catalog", "table", "uuid", "snapshot", "version"}
PROMOTED = "icelog.mirror.promoted"
SOURCE_SNAPSHOT = "icelog.source-snapshot-id"  # in a mirrored snapshot's summary


def read(properties: Mapping[str, str], prop: IntProperty, table: str | None = None) -> int | None:
    """``prop``'s value in a table's ``properties`` (its default when unset).

    Raises:
        InvalidProperty: the value is malformed or out of bounds.
    """
    raw = properties.get(prop.key)
    return prop.default if raw is None or raw == "" and prop.default is None else prop.parse(raw, table)


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
            snapshots_keep=read(properties, SNAPSHOTS_KEEP, table),  # type: ignore[arg-type] - never None
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
        if key in KNOWN and not (raw == "" and KNOWN[key].default is None):
            KNOWN[key].parse(raw, table)
        elif key == CHECK_EXPECTED_OFFSETS and raw.strip().lower() not in ("true", "false"):
            raise InvalidProperty(table=table, key=key, value=raw, reason="must be true or false")


# What ``icelog topics alter`` may set or unset: the knobs above. ``icelog.key-column`` is fixed at
# create (rows were routed and hashed by it); every other ``icelog.*`` key is icelog's own state.
SETTABLE: tuple[str, ...] = (*KNOWN, CHECK_EXPECTED_OFFSETS)


# Iceberg table metadata that only an Iceberg operation changes, never a property write.
ICEBERG_RESERVED = frozenset({"format-version", "uuid", "location", "current-snapshot-id", "sort-order", "partition-spec"})


def is_iceberg_property(key: str) -> bool:
    """A plain Iceberg property (``commit.manifest.target-size-bytes``, ``write.parquet.*``, ...):
    set and removed as it is, as any Iceberg writer may. icelog's own are ``icelog.*``."""
    return bool(key) and not key.startswith("icelog.") and key not in ICEBERG_RESERVED and key == key.strip()


def _refusal(key: str) -> str:
    if key == KEY_COLUMN:
        return "it is fixed when the table is created (rows were routed and hashed by it)"
    if key in ICEBERG_RESERVED:
        return "it is Iceberg table metadata that an Iceberg operation changes, not a property"
    return f"it is not a property icelog lets you set; those are {', '.join(SETTABLE)} and any Iceberg property outside icelog.*"


def alteration(updates: Mapping[str, str], removals: Sequence[str], table: str | None = None) -> dict[str, str]:
    """Check a change of a table's knobs; returns ``updates`` in canonical form (``0060`` -> ``60``).

    Every key must be in :data:`SETTABLE` (each value valid for its key) or a plain Iceberg
    property (:func:`is_iceberg_property`: any non-empty value). An empty value is refused:
    remove the key instead. Nothing is written here.

    Raises:
        UnknownProperty: a key that is not a knob.
        InvalidProperty: the first value refused, naming the key and what it allows.
    """
    for key in [*updates, *removals]:
        if key not in SETTABLE and not is_iceberg_property(key):
            raise UnknownProperty(table=table, key=key, value=updates.get(key, ""), reason=_refusal(key))
    both = sorted(set(updates) & set(removals))
    if both:
        raise InvalidProperty(table=table, key=both[0], value=updates[both[0]], reason="both set and unset: give one")
    canonical = {}
    for key, raw in updates.items():
        if key not in SETTABLE:  # a plain Iceberg property: Iceberg reads and checks it
            if not isinstance(raw, str) or not raw.strip():
                raise InvalidProperty(table=table, key=key, value=str(raw), reason="must not be empty: remove the key instead")
            canonical[key] = raw.strip()
        elif key == CHECK_EXPECTED_OFFSETS:
            if not isinstance(raw, str) or raw.strip().lower() not in ("true", "false"):
                raise InvalidProperty(table=table, key=key, value=str(raw), reason="must be true or false")
            canonical[key] = raw.strip().lower()
        else:
            canonical[key] = str(KNOWN[key].parse(raw, table))
    return canonical


def effective(properties: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each settable knob of a table: its value (the default when unset; None: no limit), its
    default, whether it is set, and, for a malformed value set by another tool, why it is refused."""
    shown: dict[str, dict[str, Any]] = {}
    for key in SETTABLE:
        default: Any = KNOWN[key].default if key in KNOWN else "false"
        raw = properties.get(key)
        if raw == "" and key in KNOWN and KNOWN[key].default is None:
            raw = None  # read() takes an empty value of an unbounded knob as unset
        entry: dict[str, Any] = {"value": default, "default": default, "set": raw is not None}
        if raw is not None:
            try:
                entry["value"] = alteration({key: raw}, ())[key]
                entry["value"] = int(entry["value"]) if key in KNOWN else entry["value"]
            except InvalidProperty as e:
                entry.update(value=raw, invalid=e.reason)
        shown[key] = entry
    return shown
