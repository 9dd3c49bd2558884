"""The icelog exception taxonomy.

One root, :class:`IcelogError`. Retry semantics live in the type, not the message:

* :class:`TransientError` — a retry of the *same* request may succeed (a commit lost a race
  too many times, or its outcome is unknown and could not be resolved).
* :class:`TerminalError` — retrying the same request cannot help (bad input, an offset
  mismatch, a fenced producer). :class:`InvalidInput` is also a ``ValueError``.

Every exception carries its structured fields in ``fields`` and is picklable, because it
crosses Spark-executor and Airflow-worker process boundaries.
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[IcelogError], fields: dict[str, Any]) -> IcelogError:
    return cls(**fields)


class IcelogError(Exception):
    """Root of every error icelog raises on purpose."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        super().__init__(self.describe())

    def describe(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.fields.items())

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.fields))

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": str(self), **self.fields}


class TransientError(IcelogError):
    """A retry of the same request may succeed."""


class TerminalError(IcelogError):
    """Retrying the same request cannot succeed."""


# --- bad input (I8): nothing was written -------------------------------------------------


class InvalidInput(TerminalError, ValueError):
    """The request itself is malformed; the table is unchanged."""

    def describe(self) -> str:
        return self.fields.get("reason", super().describe())


class InvalidIdentifier(InvalidInput):
    def describe(self) -> str:
        return f"invalid identifier {self.fields['identifier']!r}: {self.fields['reason']}"


class SchemaMismatch(InvalidInput):
    def describe(self) -> str:
        return f"rows do not match the payload schema of {self.fields['table']}: {self.fields['reason']}"


class EmptyBatch(InvalidInput):
    def describe(self) -> str:
        return f"empty batch for {self.fields['table']} partition {self.fields['partition']}: nothing to append"


class MalformedInput(InvalidInput):
    def describe(self) -> str:
        where = f" at line {self.fields['line']}" if self.fields.get("line") else ""
        return f"malformed input{where}: {self.fields['reason']}"


class InvalidOffset(InvalidInput):
    def describe(self) -> str:
        return f"invalid offset {self.fields['offset']!r} for partition {self.fields['partition']}: {self.fields['reason']}"


# --- unknown things ------------------------------------------------------------------------


class UnknownTable(TerminalError):
    def describe(self) -> str:
        return f"no log table {self.fields['table']!r} in catalog {self.fields.get('catalog')!r}"


class TableAlreadyExists(TerminalError):
    def describe(self) -> str:
        return f"log table {self.fields['table']!r} already exists"


class NotALogTable(TerminalError):
    def describe(self) -> str:
        return f"{self.fields['table']!r} is an Iceberg table but not an icelog log table"


class UnknownPartition(TerminalError):
    def describe(self) -> str:
        return (
            f"{self.fields['table']} has no partition {self.fields['partition']!r} "
            f"(partitions 0..{self.fields['partitions'] - 1})"
        )


# --- conflicts ------------------------------------------------------------------------------


class ConflictError(IcelogError):
    """The request lost against the table's current state (CLI exit code 3)."""


class OffsetMismatch(ConflictError, TerminalError):
    """A conditional append expected a log end offset that is no longer current (I2)."""

    def describe(self) -> str:
        return (
            f"{self.fields['table']} partition {self.fields['partition']}: expected offset "
            f"{self.fields['expected']} but the log end offset is {self.fields['actual']}"
        )


class CommitConflict(ConflictError, TransientError):
    """Every attempt lost the compare-and-swap to a concurrent commit."""

    def describe(self) -> str:
        return f"{self.fields['table']}: commit lost {self.fields['attempts']} compare-and-swap races in a row"


class CatalogUnavailable(TransientError):
    """The catalog could not be read (e.g. a busy SQLite database) for every attempt."""

    def describe(self) -> str:
        return f"{self.fields['table']}: catalog unavailable ({self.fields['reason']})"


class CommitOutcomeUnknown(TransientError):
    """The catalog call failed and icelog could not tell whether the commit landed."""

    def describe(self) -> str:
        return (
            f"{self.fields['table']}: outcome of commit {self.fields['commit_id']} is unknown "
            f"({self.fields['reason']}); re-send with the same commit id"
        )


# --- idempotent producers (I4) ------------------------------------------------------------


class UnknownProducer(TerminalError):
    def describe(self) -> str:
        return (
            f"{self.fields['table']}: producer id {self.fields['producer_id']} is unknown "
            "(never initialised here, or expired after disuse): call `producers init` again"
        )


class ProducerFenced(ConflictError, TerminalError):
    """A newer instance of this producer exists; this (zombie) instance may never write again."""

    def describe(self) -> str:
        return (
            f"{self.fields['table']}: producer {self.fields['producer_id']} epoch {self.fields['epoch']} "
            f"is fenced by epoch {self.fields['current_epoch']}"
        )


class InvalidProducerEpoch(TerminalError):
    def describe(self) -> str:
        return (
            f"{self.fields['table']}: producer {self.fields['producer_id']} sent epoch {self.fields['epoch']}, "
            f"ahead of the current epoch {self.fields['current_epoch']}"
        )


class OutOfOrderSequence(TerminalError):
    def describe(self) -> str:
        return (
            f"{self.fields['table']} partition {self.fields['partition']}: producer {self.fields['producer_id']} "
            f"sent sequence {self.fields['sequence']}, expected {self.fields['expected']}"
        )


class DuplicateSequence(TerminalError):
    """The batch was written, but too long ago for its offsets to be remembered."""

    def describe(self) -> str:
        return (
            f"{self.fields['table']} partition {self.fields['partition']}: sequence {self.fields['sequence']} of "
            f"producer {self.fields['producer_id']} was already written (older than the last batches kept)"
        )
