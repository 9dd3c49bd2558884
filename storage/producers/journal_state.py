"""The transaction coordinator's state, and the files its transactions still need.

A transaction stages each send's payload under its table's ``data/staging/<txn id>`` and Spark
executors pre-write data files under ``data/txn-<txn id>``; a prepared transaction rolls
forward from them after a crash. The coordinator's state lives in the journal table's
properties (:class:`JournalState`). Orphan cleanup (``storage.admin.orphans``) asks
:func:`pending_files` what open and prepared transactions still need.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.table.metadata import TableMetadata

from icelog.storage.core.commit import load
from icelog.storage.errors import JournalUnreadable, UnknownTable
from icelog.storage.log.state import LogState
from icelog.storage.properties import TRANSACTIONS

JOURNAL = "icelog_system.transactions"


@dataclass(frozen=True)
class StagedSend:
    """One send of a transaction: a staged payload file, or (``prewritten``) a data file with
    its offsets baked in from ``expected_offset`` (written by Spark executors; never rewritten).

    ``table_uuid`` and ``schema_id`` name the table the rows were checked for: a send is made
    against one table, never another created later under its name. Sends an older version
    recorded lack them (None: not checked), and ``prewritten`` is None for a send recorded
    without the flag (4 elements, not pre-written): each is written back as it was read.
    """

    partition: int
    expected_offset: int | None
    path: str
    rows: int
    prewritten: bool | None = False
    table_uuid: str | None = None
    schema_id: int | None = None

    def to_json(self) -> list[Any]:
        fields = [self.partition, self.expected_offset, self.path, self.rows]
        if self.table_uuid is not None:
            return [*fields, bool(self.prewritten), self.table_uuid, self.schema_id]
        return fields if self.prewritten is None else [*fields, self.prewritten]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> StagedSend:
        return cls(*raw) if len(raw) >= 5 else cls(*raw, prewritten=None)

    def made_for(self) -> tuple[str, int] | None:
        """``(table uuid, schema id)`` the send was checked for; None if unrecorded."""
        return None if self.table_uuid is None else (self.table_uuid, int(self.schema_id or 0))


@dataclass(frozen=True)
class TxnOffsets:
    """A consumer group's positions committed with a transaction: ``offsets`` (``(table,
    partition, next offset)``) or ``ranges`` (``(table, partition, first, last)``, individually
    committed, as a group member's ``Consumer.commit``), and the member and generation they were
    fetched at (None: a commit from outside the group's membership)."""

    group: str
    offsets: tuple[tuple[str, int, int], ...]
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know, kept
    ranges: tuple[tuple[str, int, int, int], ...] = ()
    member: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class GroupRegistration:
    """A consumer group registered with an open transaction (Kafka's AddOffsetsToTxn), before
    the decision checks the member's generation: a consumer adopting the group's partitions
    first waits for, or finishes, every transaction registered with it."""

    group: str
    member: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class Prepared:
    """What PREPARE_COMMIT recorded: recovery rolls the transaction forward from it.

    ``decided``: the record is the commit decision itself (a catalog without atomic multi-table
    commits): each table then rolls forward in its own commit, and the transaction is never
    aborted. Otherwise it commits in one atomic commit with its COMMITTED record, and one whose
    commit can never succeed is aborted.
    """

    sends: Mapping[str, tuple[StagedSend, ...]]  # by table
    offsets: TxnOffsets | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    decided: bool = False


@dataclass(frozen=True)
class OpenTxn:
    """A transactional id's open transaction: ONGOING, or PREPARE_COMMIT with what it prepared."""

    id: str
    state: str
    started_ms: int
    last_ms: int
    partitions: Mapping[str, tuple[int, ...]]  # registered, by table
    prepared: Prepared | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    group: GroupRegistration | None = None  # registered by its first offsets (a catalog without atomic commits)


@dataclass(frozen=True)
class EndedTxn:
    """Where an ended transaction staged files (deleted after it ended, or by the next init or recover)."""

    id: str
    partitions: Mapping[str, tuple[int, ...]]  # by table
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TransactionalIdState:
    """The coordinator's state of one transactional id: its producer id and epoch, its open
    transaction, and the last transactions it committed and aborted (None: none recorded)."""

    producer_id: int | None
    epoch: int
    txn: OpenTxn | None = None
    timeout_ms: int | None = None  # None: the journal's default
    last_committed: EndedTxn | None = None
    last_aborted: EndedTxn | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JournalState(LogState):
    """The journal's log state plus the coordinator state kept in its properties: a
    :class:`TransactionalIdState` per transactional id, as JSON (:func:`encode_transactions`)::

    {"<transactional id>": {"producer_id": 7, "epoch": 2, "timeout_ms": 60000,
        "txn": null | {"id", "state", "started_ms", "last_ms", "partitions": {"<table>": [p, ...]},
                       "prepared": {"sends": {"<table>": [[p, expected, path, rows, prewritten], ...]},
                                    "offsets": null | {"group": g, "offsets": [[table, p, offset], ...],
                                                       "ranges": [[table, p, first, last], ...],
                                                       "member": m, "generation": n (each only when set)},
                                    "decided": true (only when set)},
                "group": {"group": g, "member": m, "generation": n} (only when registered)},
        "last_committed" | "last_aborted": {"id", "partitions"}}}

    ``last_committed`` and ``last_aborted`` name where the last ended transactions staged
    files, so a process that dies before deleting them leaves them to the next init or recover.
    """

    transactions: Mapping[str, TransactionalIdState] = field(default_factory=dict)
    unreadable: Mapping[str, Any] = field(default_factory=dict)  # entries that do not parse, kept as they are

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> JournalState:
        """Raises :class:`JournalUnreadable` (``transactional_id`` None) if the state is not a JSON object."""
        base = LogState.from_metadata(metadata)
        transactions, unreadable = decode_transactions(metadata.properties.get(TRANSACTIONS, "{}"))
        return cls(base.watermarks, base.producers, base.snapshot_id, transactions, unreadable)

    def to_properties(self) -> dict[str, str]:
        return {**super().to_properties(), TRANSACTIONS: encode_transactions(self.transactions, self.unreadable)}

    def check_readable(self, transactional_id: str) -> None:
        """Raise :class:`JournalUnreadable` if ``transactional_id``'s entry does not parse."""
        if transactional_id in self.unreadable:
            raise JournalUnreadable(table=JOURNAL, transactional_id=transactional_id, reason=self.unreadable[transactional_id][1])


# --- the codec: one writer (_json) and one reader (_from_json) per type ---------------------------
# Byte for byte: keys sorted, optional keys written only when set, keys it does not know (and
# optional ones stored as null) kept in ``extra``.


def encode_transactions(transactions: Mapping[str, TransactionalIdState], unreadable: Mapping[str, Any] | None = None) -> str:
    entries = {tid: raw for tid, (raw, _) in (unreadable or {}).items()}
    entries.update({tid: _state_json(s) for tid, s in transactions.items()})
    return json.dumps(entries, sort_keys=True, separators=(",", ":"))


def decode_transactions(text: str) -> tuple[dict[str, TransactionalIdState], dict[str, tuple[Any, str]]]:
    """The entries that parse, and ``{transactional id: (raw entry, why not)}`` for those that do not.

    Raises:
        JournalUnreadable: the whole state is not a JSON object.
    """
    try:
        raw_entries = json.loads(text)
    except ValueError as e:
        raise JournalUnreadable(table=JOURNAL, transactional_id=None, reason=f"not JSON: {e}") from None
    if not isinstance(raw_entries, dict):
        raise JournalUnreadable(
            table=JOURNAL, transactional_id=None, reason=f"not a JSON object but {type(raw_entries).__name__}"
        )
    parsed: dict[str, TransactionalIdState] = {}
    unreadable: dict[str, tuple[Any, str]] = {}
    for tid, raw in raw_entries.items():
        try:
            parsed[tid] = _state_from_json(raw)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            unreadable[tid] = (raw, f"{type(e).__name__}: {e}")
    return parsed, unreadable


def _set(**optional: Any) -> dict[str, Any]:
    return {k: v for k, v in optional.items() if v is not None}


def _extra(raw: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in required and (k not in optional or v is None)}


def _state_json(s: TransactionalIdState) -> dict[str, Any]:
    return {
        **s.extra,
        "producer_id": s.producer_id,
        "epoch": s.epoch,
        "txn": None if s.txn is None else _txn_json(s.txn),
        **_set(
            timeout_ms=s.timeout_ms,
            last_committed=s.last_committed and _ended_json(s.last_committed),
            last_aborted=s.last_aborted and _ended_json(s.last_aborted),
        ),
    }


def _state_from_json(raw: Mapping[str, Any]) -> TransactionalIdState:
    ended = {k: _ended_from_json(raw[k]) if raw.get(k) is not None else None for k in ("last_committed", "last_aborted")}
    return TransactionalIdState(
        producer_id=raw["producer_id"],
        epoch=raw["epoch"],
        txn=None if raw.get("txn") is None else _txn_from_json(raw["txn"]),
        timeout_ms=raw.get("timeout_ms"),
        **ended,
        extra=_extra(raw, ("producer_id", "epoch", "txn"), ("timeout_ms", "last_committed", "last_aborted")),
    )


def _txn_json(txn: OpenTxn) -> dict[str, Any]:
    return {
        **txn.extra,
        "id": txn.id,
        "state": txn.state,
        "started_ms": txn.started_ms,
        "last_ms": txn.last_ms,
        "partitions": {t: list(ps) for t, ps in txn.partitions.items()},
        **_set(
            prepared=txn.prepared and _prepared_json(txn.prepared),
            group=txn.group and _set(group=txn.group.group, member=txn.group.member, generation=txn.group.generation),
        ),
    }


def _txn_from_json(raw: Mapping[str, Any]) -> OpenTxn:
    return OpenTxn(
        id=raw["id"],
        state=raw["state"],
        started_ms=raw["started_ms"],
        last_ms=raw["last_ms"],
        partitions={t: tuple(ps) for t, ps in raw["partitions"].items()},
        prepared=None if raw.get("prepared") is None else _prepared_from_json(raw["prepared"]),
        extra=_extra(raw, ("id", "state", "started_ms", "last_ms", "partitions"), ("prepared", "group")),
        group=None
        if raw.get("group") is None
        else GroupRegistration(raw["group"]["group"], raw["group"].get("member"), raw["group"].get("generation")),
    )


def _prepared_json(prepared: Prepared) -> dict[str, Any]:
    offsets = prepared.offsets
    return {
        **prepared.extra,
        "sends": {t: [send.to_json() for send in sends] for t, sends in prepared.sends.items()},
        "offsets": None
        if offsets is None
        else {
            **offsets.extra,
            "group": offsets.group,
            "offsets": [list(o) for o in offsets.offsets],
            **_set(ranges=[list(r) for r in offsets.ranges] or None, member=offsets.member, generation=offsets.generation),
        },
        **({"decided": True} if prepared.decided else {}),
    }


def _prepared_from_json(raw: Mapping[str, Any]) -> Prepared:
    offsets = raw.get("offsets")  # every version writes it, null for none
    return Prepared(
        sends={t: tuple(map(StagedSend.from_json, sends)) for t, sends in raw["sends"].items()},
        offsets=None if offsets is None else _offsets_from_json(offsets),
        extra=_extra(raw, ("sends", "offsets", "decided")),
        decided=bool(raw.get("decided", False)),
    )


def _offsets_from_json(raw: Mapping[str, Any]) -> TxnOffsets:
    return TxnOffsets(
        raw["group"],
        tuple(tuple(o) for o in raw["offsets"]),
        _extra(raw, ("group", "offsets"), ("ranges", "member", "generation")),
        ranges=tuple(tuple(r) for r in raw.get("ranges") or ()),  # type: ignore[misc]
        member=raw.get("member"),
        generation=raw.get("generation"),
    )


def _ended_json(ended: EndedTxn) -> dict[str, Any]:
    return {**ended.extra, "id": ended.id, "partitions": {t: list(ps) for t, ps in ended.partitions.items()}}


def _ended_from_json(raw: Mapping[str, Any]) -> EndedTxn:
    return EndedTxn(raw["id"], {t: tuple(ps) for t, ps in raw["partitions"].items()}, _extra(raw, ("id", "partitions")))


def staging_dir(table_location: str, txn_id: str) -> str:
    """Payload files of sends: rewritten at commit, then deleted."""
    return f"{table_location}/data/staging/{txn_id}"


def prewritten_dir(table_location: str, txn_id: str) -> str:
    """Data files written by Spark executors for a transaction: committed as they are."""
    return f"{table_location}/data/txn-{txn_id}"


def pending_files(catalog: Catalog, table_location: str) -> tuple[set[str], tuple[str, ...]]:
    """What open and prepared transactions still need under a table: ``(files, folders)``.

    Orphan cleanup keeps them: a prepared transaction rolls forward from its staged files,
    and an open one may still prepare. Folders end with ``/``.
    """
    try:
        state = JournalState.from_metadata(load(catalog, JOURNAL).metadata)
    except UnknownTable:
        return set(), ()
    transactions = state.transactions
    files: set[str] = set()
    folders: list[str] = []
    if state.unreadable:  # what those transactions staged is unknown: keep every transaction's files
        folders += [f"{table_location}/data/staging/", f"{table_location}/data/txn-"]
    for entry in transactions.values():
        txn = entry.txn
        if txn is None:
            continue
        folders += [staging_dir(table_location, txn.id) + "/", prewritten_dir(table_location, txn.id) + "/"]
        if txn.prepared is not None:
            files.update(send.path for sends in txn.prepared.sends.values() for send in sends)
    return files, tuple(folders)
