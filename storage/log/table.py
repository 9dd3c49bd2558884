"""Log tables: create, describe, append (optionally conditional), read.

This is the public API. Every write goes through :func:`storage.core.commit.commit`.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import (
    And,
    EqualTo,
    GreaterThanOrEqual,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Or,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.types import IntegerType, LongType, StringType

from icelog.storage import properties as icelog_properties
from icelog.storage.core.bases import LastSeen
from icelog.storage.core.catalog import ensure_namespace
from icelog.storage.core.commit import CommitOutcome, Decision, Request, commit, load, new_commit_id, refuse_system_table
from icelog.storage.errors import (
    EmptyBatch,
    ExpectedOffsetRequired,
    IcelogError,
    InvalidInput,
    InvalidOffset,
    NotALogTable,
    OffsetMismatch,
    TableAlreadyExists,
    TableChanged,
    UnknownPartition,
    UnknownTable,
)
from icelog.storage.log import schema as cols
from icelog.storage.log import sequences
from icelog.storage.log.files import prewritten_files, store_reachable, write_log_files
from icelog.storage.log.maintenance import PartitionGrowth
from icelog.storage.log.scan import check_snapshot
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.state import FORMAT_VERSION, LogState, Watermark
from icelog.storage.properties import CHECK_EXPECTED_OFFSETS, FORMAT, HEAD, VERSION

MANIFEST_TARGET_BYTES = 256 * 1024  # ~850 data files' entries: what one manifest merge rewrites at most

TABLE_DEFAULTS = {
    "format-version": "2",
    # Belt and braces: icelog never calls pyiceberg's retrying commit, but other writers
    # of the same table should fail rather than rebase a stale append
    # (docs/guarantees.md#i3-decide-on-the-base-you-replace).
    "commit.retry.num-retries": "0",
    # Readers may hold an old metadata pointer: never delete a metadata file at commit time
    # (storage.core.commit deletes superseded ones after a grace; other writers should not at all).
    # The log stays short: pyiceberg deep-copies the whole metadata many times per commit.
    "write.metadata.previous-versions-max": "10",
    "write.metadata.delete-after-commit.enabled": "false",
    "write.parquet.compression-codec": "zstd",
    # Appends merge small manifests once this many pile up, so the manifest list (rewritten
    # by every commit) stays short and commit latency stays flat as history grows.
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "50",
    # A merge rewrites every manifest in its bin, and a bin holds up to this many bytes: at
    # pyiceberg's 8 MB every merge rewrote the one manifest of all live files (3 MB, 2 s at
    # 10,000 files, every 50 commits). A manifest that outgrows this is left as it is.
    "commit.manifest.target-size-bytes": str(MANIFEST_TARGET_BYTES),
}


@dataclass
class AppendResult:
    """Offsets assigned by one append: ``ranges[p] = (base_offset, next_offset)``."""

    table: str
    ranges: dict[int, tuple[int, int]]
    commit_id: str
    snapshot_id: int | None = None
    duplicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OffsetAndTimestamp:
    """Kafka's ``OffsetAndTimestamp``: the first offset of a partition stamped at or after a time.

    ``timestamp`` is that record's ``log_timestamp``; None when no record is that late, and
    ``offset`` is then the log end (where a reader starting there waits for new records).
    """

    offset: int
    timestamp: dt.datetime | None


def checked_on(table: Table) -> tuple[str, int]:
    """What rows converted for ``table`` are valid for: the same table (uuid) at the same schema."""
    return str(table.metadata.table_uuid), table.metadata.current_schema_id


@dataclass
class AppendRequest(Request):
    """One append to one or more partitions in one commit.

    Rows come either as ``payload`` (Arrow, system columns added at decision time) or as
    ``files``: data files already written elsewhere (Spark executors) with their offsets
    baked in, which is why ``files`` requires an expected offset for each partition.
    """

    state_type = LogState

    table: str
    payload: Mapping[int, pa.Table]
    expected_offsets: Mapping[int, int] = field(default_factory=dict)
    commit_id: str = ""
    producer: ProducerBatch | None = None  # checked at commit
    files: Mapping[int, list[DataFile]] = field(default_factory=dict)
    checked_on: tuple[str, int] | None = None  # (table uuid, schema id) the payload was converted for

    def counts(self) -> dict[int, int]:
        if self.files:
            return {p: sum(f.record_count for f in fs) for p, fs in self.files.items()}
        return {p: rows.num_rows for p, rows in self.payload.items()}

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        return write_log_files(table, rows)

    def decide(self, state: LogState, table: Table) -> Decision:
        cols.check_log_spec(self.table, table.metadata)
        if self.checked_on is not None and self.checked_on != checked_on(table):
            # A table dropped and re-created under the name (or its schema evolved) since the rows
            # were checked: they were converted for the other one, and must not be written here.
            raise TableChanged(table=self.table, reason=f"(uuid, schema id) {self.checked_on} -> {checked_on(table)}")
        counts = self.counts()
        for p in counts:
            if p >= state.partitions:
                raise UnknownPartition(table=self.table, partition=p, partitions=state.partitions)
        if table.metadata.properties.get(CHECK_EXPECTED_OFFSETS, "false").lower() == "true":
            unnamed = sorted(p for p in counts if p not in self.expected_offsets)
            if unnamed:
                raise ExpectedOffsetRequired(table=self.table, partitions=unnamed)
        ranges = {p: (state.end(p), state.end(p) + n) for p, n in counts.items()}
        lineage: dict[str, str] = {}
        seqs: Mapping[int, int] = {}
        new_state = state
        now_us = int(time.time() * 1_000_000)
        if self.producer is not None:
            # Before the offset check: a re-sent batch that already landed returns its
            # original offsets even though the log has moved on since.

            expiry = sequences.expiry_ms(table.metadata.properties)
            verdict = sequences.admit(self.table, state, self.producer, ranges, now_us // 1000, expiry)
            if verdict.duplicate_of is not None:
                result = AppendResult(self.table, verdict.duplicate_of, self.commit_id, state.snapshot_id, True)
                return Decision(state=state, result=result, write=False)
            new_state, lineage, seqs = verdict.state, verdict.lineage, self.producer.first_sequences
        for p, expected in self.expected_offsets.items():
            if state.end(p) != expected:
                raise OffsetMismatch(table=self.table, partition=p, expected=expected, actual=state.end(p))
        new_state = new_state.with_ends({p: r[1] for p, r in ranges.items()})
        result = AppendResult(self.table, dict(ranges), self.commit_id)
        if self.files:
            added = tuple(f for p in sorted(self.files) for f in self.files[p])
            return Decision(state=new_state, result=result, ranges=ranges, add_files=added, lineage=lineage)
        rows = {p: with_system_columns(self.payload[p], p, r[0], now_us, self.producer, seqs.get(p)) for p, r in ranges.items()}
        return Decision(state=new_state, result=result, rows=rows, ranges=ranges, lineage=lineage)

    def receipt(self, result: AppendResult) -> dict[str, list[int]]:
        return {str(p): list(r) for p, r in result.ranges.items()}

    def from_receipt(self, receipt: Mapping[str, list[int]]) -> AppendResult:
        ranges = {int(p): (r[0], r[1]) for p, r in receipt.items()}
        return AppendResult(self.table, ranges, self.commit_id, None, True)


def with_system_columns(
    payload: pa.Table, partition: int, base: int, now_us: int, producer: ProducerBatch | None, first_seq: int | None
) -> pa.Table:
    n = payload.num_rows
    system = {
        cols.PARTITION: pa.array(np.full(n, partition, dtype=np.int32)),
        cols.OFFSET: pa.array(np.arange(base, base + n, dtype=np.int64)),
        cols.TIMESTAMP: pa.array(np.full(n, now_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
    }
    if producer is None:
        system[cols.PRODUCER_ID] = pa.nulls(n, pa.int64())
        system[cols.PRODUCER_EPOCH] = pa.nulls(n, pa.int32())
        system[cols.PRODUCER_SEQ] = pa.nulls(n, pa.int32())
    else:
        system[cols.PRODUCER_ID] = pa.array(np.full(n, producer.producer_id, dtype=np.int64))
        system[cols.PRODUCER_EPOCH] = pa.array(np.full(n, producer.epoch, dtype=np.int32))
        system[cols.PRODUCER_SEQ] = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int32))
    columns = list(system.values()) + payload.columns
    return pa.Table.from_arrays(columns, names=list(system) + payload.column_names)


class LogTable:
    """A log table in a catalog. Cheap to construct; each call reads the current metadata."""

    def __init__(self, catalog: Catalog, identifier: str) -> None:
        self.catalog = catalog
        self.identifier = cols.qualified(identifier)
        # The table as this object last read or committed it: an append's first base, which
        # saves a catalog read (a request to a REST server). Only a base: see storage.core.bases.
        self._seen = LastSeen()

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        catalog: Catalog,
        identifier: str,
        partitions: int,
        payload: list[dict] | None = None,
        properties: Mapping[str, str] | None = None,
        *,
        system: bool = False,
    ) -> LogTable:
        """Create a log table.

        Args:
            catalog: Where to create it.
            identifier: ``namespace.table`` (a bare name goes to namespace ``logs``).
            partitions: Number of log partitions, at least 1.
            payload: Payload columns ``[{"name", "type", "required"?}]``; default key/value strings.
            properties: Extra Iceberg table properties. ``icelog.key-column`` names the payload
                column whose hash fills ``log_key_hash`` (default ``key``, when there is one).
            system: icelog's own system tables only (the coordinator journal).

        Raises:
            InvalidIdentifier, InvalidInput: bad name (``icelog_system.*`` is reserved),
                partition count or payload schema.
            InvalidProperty: a malformed ``icelog.*`` property (``storage.properties``).
            TableAlreadyExists: the table exists.
        """
        namespace, name = cols.parse_identifier(identifier)
        if not system:
            refuse_system_table(f"{namespace}.{name}")
        icelog_properties.validate(properties or {}, f"{namespace}.{name}")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= 100_000:
            raise InvalidInput(reason=f"partitions must be an integer in 1..100000, got {partitions!r}")
        fields = cols.payload_fields(payload)
        key_column = (properties or {}).get(icelog_properties.KEY_COLUMN, cols.DEFAULT_KEY_COLUMN)
        if icelog_properties.KEY_COLUMN in (properties or {}) and key_column not in {f[0] for f in fields}:
            raise InvalidInput(reason=f"{icelog_properties.KEY_COLUMN}={key_column!r} is not a payload column")
        # log_key_hash exists only when the payload has the key column it hashes, of a type
        # every engine turns into the same string.
        hashable = {name for name, t, _ in fields if isinstance(t, (StringType, IntegerType, LongType))}
        schema = cols.log_schema(fields, key_hash=key_column in hashable)
        props = {
            **TABLE_DEFAULTS,
            # Files written by other engines (Spark) carry no Iceberg field ids: map by name.
            "schema.name-mapping.default": schema.name_mapping.model_dump_json(),
            **(properties or {}),
            **LogState.initial(partitions).to_properties(),
            VERSION: "0",
            HEAD: "",  # no snapshot yet; see storage.core.commit.check_head
            FORMAT: FORMAT_VERSION,  # marks a log table (the producer-id system table has none)
        }
        ensure_namespace(catalog, namespace)
        # pyiceberg writes the new table's first metadata file before the catalog refuses a
        # name in use: asking first leaves no orphan file in an existing table's folder.
        if catalog.table_exists(f"{namespace}.{name}"):
            raise TableAlreadyExists(table=f"{namespace}.{name}")
        try:
            catalog.create_table(
                f"{namespace}.{name}",
                schema=schema,
                partition_spec=cols.log_partition_spec(schema),
                sort_order=cols.log_sort_order(schema),
                properties=props,
            )
        except TableAlreadyExistsError as e:
            raise TableAlreadyExists(table=f"{namespace}.{name}") from e
        return cls(catalog, f"{namespace}.{name}")

    @classmethod
    def open(cls, catalog: Catalog, identifier: str) -> LogTable:
        log_table = cls(catalog, identifier)
        log_table.table()
        return log_table

    def table(self) -> Table:
        table = load(self.catalog, self.identifier)
        if FORMAT not in table.metadata.properties:
            raise NotALogTable(table=self.identifier)
        self._seen.put(self.identifier, table)
        return table

    def _last_seen(self) -> Table | None:
        return self._seen.get(self.identifier)

    def state(self) -> LogState:
        return LogState.from_metadata(self.table().metadata)

    def watermarks(self) -> dict[int, Watermark]:
        return dict(self.state().watermarks)

    def drop(self, *, purge: bool = False) -> str:
        """Remove the table from the catalog; returns the metadata file it last pointed at.

        Without ``purge`` every file stays where it is, and ``catalog.register_table(name,
        <that file>)`` brings the table back. With ``purge``, pyiceberg's ``purge_table`` also
        deletes the data, manifest and metadata files its retained snapshots and metadata log
        reference (files nothing references, e.g. of expired snapshots, stay).

        Guards (transactions, consumer groups) belong to the caller: this only refuses
        icelog's system tables, which hold state the coordinator and the groups believe.

        Raises:
            InvalidIdentifier: an ``icelog_system.*`` table.
            UnknownTable, NotALogTable: nothing to drop.
        """
        refuse_system_table(self.identifier)
        location = self.table().metadata_location
        try:
            if purge:
                self.catalog.purge_table(self.identifier)
            else:
                self.catalog.drop_table(self.identifier)
        except NoSuchTableError as e:  # dropped meanwhile
            raise UnknownTable(table=self.identifier, catalog=self.catalog.name) from e
        finally:
            self._seen.forget(self.identifier)
        return location

    def payload_schema(self, table: Table | None = None) -> pa.Schema:
        return cols.payload_arrow_schema((table or self.table()).schema())

    # --- writes ---------------------------------------------------------------------------

    def append(
        self,
        rows: Mapping[int, pa.Table | list[dict]],
        expected_offsets: Mapping[int, int] | None = None,
        *,
        producer: ProducerBatch | None = None,
        commit_id: str | None = None,
    ) -> AppendResult:
        """Append rows to one or more partitions in one atomic commit.

        Args:
            rows: Payload rows per partition (Arrow tables or lists of dicts).
            expected_offsets: Per partition, the log end offset this append expects (KIP-27).
                The append commits only if each named partition still ends there.
            producer: A :class:`storage.log.sequences.ProducerBatch` for idempotent appends.
            commit_id: Idempotency key. A re-send with the same id returns the original result
                and writes nothing while the id is in the table's commit-id registry: the last
                ``icelog.commit-ids.keep`` commits (1,000), and older ones for
                ``icelog.commit-ids.min-retention-ms`` (7 days), at most
                ``storage.core.registry.COMMIT_IDS_MAX`` ids in all. Make ids with
                :func:`storage.core.commit.new_commit_id` (a UUIDv7): past the window, a re-send of
                such an id raises :class:`CommitIdForgotten` instead of writing again. An id
                without a time cannot be judged there and is written as new.

        Returns:
            The offsets assigned, per partition.

        Raises:
            OffsetMismatch: a partition's log end offset is not the expected one.
            UnknownPartition, EmptyBatch, SchemaMismatch, InvalidOffset: bad input; nothing written.
            CommitConflict, CommitOutcomeUnknown: transient; safe to re-send with the same commit id.
            CommitIdForgotten: the re-sent id may have landed before the registry's window.
            InvalidProperty: a malformed ``icelog.*`` table property; nothing written.
        """
        resent = commit_id is not None  # an id made here was never sent
        commit_id = commit_id or new_commit_id()
        seen = self._last_seen()
        table = seen or self.table()
        while True:  # at most twice: on the table as last seen, then as it is now
            fresh = table is not seen
            try:
                payload = self._validate(rows, expected_offsets or {}, LogState.from_metadata(table.metadata), table, producer)
                request = AppendRequest(
                    self.identifier, payload, dict(expected_offsets or {}), commit_id, producer, checked_on=checked_on(table)
                )
            except IcelogError:
                if fresh:
                    raise
                table = self.table()  # judge the rows by the table as it is now, not as it was
                continue
            try:
                return self._commit(request, table, resent=resent).result
            except TableChanged:  # re-created or evolved since it was last seen: check the rows again
                if fresh:
                    raise
                table = self.table()

    def commit_files(
        self,
        files: Mapping[int, list[str]],
        expected_offsets: Mapping[int, int],
        *,
        producer: ProducerBatch | None = None,
        commit_id: str | None = None,
    ) -> AppendResult:
        """Commit Parquet files written elsewhere (e.g. by Spark executors) as one append.

        Each file must hold rows of one partition, with consecutive offsets; together the
        files of a partition must cover ``[expected, expected + rows)`` exactly. This is
        checked from the files' statistics before anything is committed.

        Args:
            files: Parquet file paths per partition, inside the table's location.
            expected_offsets: The log end offset each partition had when the offsets were
                assigned; required for every partition in ``files``.
            producer: Optional idempotent-producer batch.
            commit_id: Idempotency key.

        Raises:
            InvalidInput: a file breaks the rules above (``CorruptBatch`` when its offsets or
                partition do, read from its rows); nothing is committed.
            OffsetMismatch: the log moved since the offsets were assigned.
        """
        request = self.files_request(files, expected_offsets, producer=producer, commit_id=commit_id)
        return self._commit(request, resent=commit_id is not None).result

    def files_request(
        self,
        files: Mapping[int, list[str]],
        expected_offsets: Mapping[int, int],
        *,
        producer: ProducerBatch | None = None,
        commit_id: str | None = None,
    ) -> AppendRequest:
        """The checked request of :meth:`commit_files`, to run alone or in a multi-table commit."""
        table = self.table()
        state = LogState.from_metadata(table.metadata)
        described = prewritten_files(table, self.identifier, state.partitions, files, expected_offsets)
        if producer is not None:
            producer.validate({p: sum(f.record_count for f in fs) for p, fs in described.items()})
        return AppendRequest(
            self.identifier,
            {},
            dict(expected_offsets),
            commit_id or new_commit_id(),
            producer,
            described,
            checked_on=checked_on(table),
        )

    def _commit(self, request: Any, loaded: Table | None = None, *, resent: bool = True) -> CommitOutcome:
        outcome = commit(self.catalog, self.identifier, request, commit_id=request.commit_id, loaded=loaded, resent=resent)
        self._seen.put(self.identifier, outcome.table)
        return outcome

    def conform(self, rows: Mapping[int, pa.Table | list[dict]], table: Table | None = None) -> dict[int, pa.Table]:
        """Validate rows per partition and cast them to the payload schema (I8: typed errors)."""
        table = table or self.table()
        return self._validate(rows, {}, LogState.from_metadata(table.metadata), table)

    def _validate(
        self,
        rows: Mapping[int, Any],
        expected: Mapping[int, int],
        state: LogState,
        table: Table,
        producer: ProducerBatch | None = None,
    ) -> dict[int, pa.Table]:
        if not rows:
            raise InvalidInput(reason="an append needs at least one partition with rows")
        payload_schema = self.payload_schema(table)
        payload: dict[int, pa.Table] = {}
        for p, batch in rows.items():
            if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < state.partitions:
                raise UnknownPartition(table=self.identifier, partition=p, partitions=state.partitions)
            if isinstance(batch, list):
                try:
                    batch = pa.Table.from_pylist(batch)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                    raise cols.SchemaMismatch(table=self.identifier, reason=str(e)) from e
            if not isinstance(batch, pa.Table):
                raise InvalidInput(reason=f"partition {p}: rows must be a pyarrow.Table or a list of dicts")
            if batch.num_rows == 0:
                raise EmptyBatch(table=self.identifier, partition=p)
            payload[p] = cols.conform_payload(self.identifier, batch, payload_schema)
        for p, k in expected.items():
            if p not in payload:
                raise InvalidInput(reason=f"expected offset given for partition {p}, which has no rows")
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise InvalidOffset(partition=p, offset=k, reason="an expected offset is an integer >= 0")
        if producer is not None:
            producer.validate({p: rows.num_rows for p, rows in payload.items()})
        return payload

    def add_partitions(self, count: int) -> dict[str, int]:
        """Grow the table to ``count`` partitions (partitions are never removed)."""

        return self._commit(PartitionGrowth(self.identifier, count)).result

    # --- reads ----------------------------------------------------------------------------

    def read(
        self,
        partition: int,
        start: int | None = None,
        end: int | None = None,
        snapshot_id: int | None = None,
        key_ranges: Sequence[tuple[int, int]] | None = None,
    ) -> pa.Table:
        """Rows of ``partition`` with offsets in ``[start, end)``, in offset order.

        ``key_ranges`` (inclusive ``(lo, hi)`` key hashes) lets the scan skip the row groups of
        clustered files whose ``log_key_hash`` statistics fall outside them. It only prunes:
        other rows may still come back (rows of unclustered files, or with no hash), so a
        caller filters by the key hash itself.
        """
        table = self.table()
        state = LogState.from_metadata(table.metadata)
        if not 0 <= partition < state.partitions:
            raise UnknownPartition(table=self.identifier, partition=partition, partitions=state.partitions)
        check_snapshot(table, snapshot_id)
        condition: Any = EqualTo(cols.PARTITION, partition)
        if start is not None:
            condition = And(condition, GreaterThanOrEqual(cols.OFFSET, start))
        if end is not None:
            condition = And(condition, LessThan(cols.OFFSET, end))
        if key_ranges and cols.KEY_HASH in table.schema().column_names:
            inside = [And(GreaterThanOrEqual(cols.KEY_HASH, lo), LessThanOrEqual(cols.KEY_HASH, hi)) for lo, hi in key_ranges]
            condition = And(condition, functools.reduce(Or, inside, IsNull(cols.KEY_HASH)))
        with store_reachable(self.identifier):
            return table.scan(row_filter=condition, snapshot_id=snapshot_id).to_arrow().sort_by(cols.OFFSET)

    def offsets_for_time(
        self, at_us: int, partitions: Sequence[int] | None = None, *, event_time: bool = False
    ) -> dict[int, OffsetAndTimestamp]:
        """Kafka's ``offsetsForTimes``: per partition, the earliest offset in ``[log_start, log_end)``
        whose ``log_timestamp`` is at or after ``at_us``, else the log end.

        Reads one snapshot (the watermarks and the rows of the same metadata). Only the files
        whose time bounds reach ``at_us`` are read, and of them three columns.

        Args:
            at_us: The time, in epoch microseconds (``log_timestamp``'s precision).
            partitions: The partitions to answer for (default: all).
            event_time: By the table's event-time column (its one timestamp payload column,
                :func:`schema.event_time_column`; a timestamp without a zone is read as UTC)
                instead of append time. Event times need not grow with offsets: the answer is
                the earliest offset of an event at or after ``at_us`` (as Kafka's lookup by a
                producer's CreateTime), and its ``timestamp`` is that event's time.

        Raises:
            UnknownPartition: a partition the table lacks.
            InvalidInput: ``at_us`` is not an integer time within the dates a ``log_timestamp``
                reads back as (years 1 to 9999), or ``event_time`` on a table without one
                event-time column.
        """
        import pyarrow.compute as pc

        if not _is_date(at_us):
            raise InvalidInput(reason=f"a time is epoch microseconds within years 1 to 9999, not {at_us!r}")
        table = self.table()
        column = cols.event_time_column(table.schema()) if event_time else cols.TIMESTAMP
        if column is None:
            raise InvalidInput(
                reason=f"{self.identifier} has no event-time column (exactly one payload column of a timestamp type)"
            )
        state = LogState.from_metadata(table.metadata)
        chosen = sorted(state.watermarks) if partitions is None else list(partitions)
        for p in chosen:
            if p not in state.watermarks:
                raise UnknownPartition(table=self.identifier, partition=p, partitions=state.partitions)
        found = {p: OffsetAndTimestamp(state.end(p), None) for p in chosen}
        if table.metadata.current_snapshot_id is None or not chosen:
            return found
        condition: Any = GreaterThanOrEqual(column, at_us)
        if partitions is not None:
            condition = And(condition, functools.reduce(Or, [EqualTo(cols.PARTITION, p) for p in chosen]))
        rows = (
            table.scan(
                row_filter=condition,
                selected_fields=(cols.PARTITION, cols.OFFSET, column),
                snapshot_id=table.metadata.current_snapshot_id,
            )
            .to_arrow()
            .sort_by([(cols.PARTITION, "ascending"), (cols.OFFSET, "ascending")])
        )
        for p in chosen:
            mark = state.watermarks[p]
            inside = pc.and_(
                pc.equal(rows[cols.PARTITION], p),
                pc.and_(pc.greater_equal(rows[cols.OFFSET], mark.start), pc.less(rows[cols.OFFSET], mark.end)),
            )
            first = rows.filter(inside).slice(0, 1)
            if first.num_rows:
                stamp = first[column][0].as_py()
                found[p] = OffsetAndTimestamp(
                    first[cols.OFFSET][0].as_py(), stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
                )
        return found

    def describe(self) -> dict[str, Any]:
        table = self.table()
        state = LogState.from_metadata(table.metadata)
        return {
            "table": self.identifier,
            "partitions": state.partitions,
            "offsets": {str(p): {"start": w.start, "end": w.end} for p, w in state.watermarks.items()},
            "payload": [
                {"name": f.name, "type": str(f.field_type), "required": f.required}
                for f in table.schema().fields
                if f.name not in cols.SYSTEM_COLUMNS
            ],
            "snapshot_id": state.snapshot_id,
            "snapshots": len(table.metadata.snapshots),
            "location": table.metadata.location,
            "producers": len(state.producers),
        }


def _is_date(at_us: Any) -> bool:
    """An integer time that reads back as a date (a ``log_timestamp`` is one, years 1 to 9999)."""
    if not isinstance(at_us, int) or isinstance(at_us, bool):
        return False
    try:
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=at_us)
    except OverflowError:
        return False
    return True


def list_log_tables(catalog: Catalog) -> list[str]:
    """Qualified names of every log table in the catalog."""
    names = []
    for namespace in catalog.list_namespaces():
        for ident in catalog.list_tables(namespace):
            name = ".".join(ident)
            try:
                table = load(catalog, name)
            except UnknownTable:  # dropped meanwhile
                continue
            if FORMAT in table.metadata.properties:
                names.append(name)
    return sorted(names)
