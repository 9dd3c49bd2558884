"""Table state kept in table properties: what a commit request decides on.

Properties are one copy per table (not one per snapshot), so they survive snapshot expiry,
and they change in the same catalog commit as the data they describe. Each commit request
names its state type (a log table's is ``storage.log.state.LogState``; a system table's is
:class:`SystemState`); the commit core decodes the base with it and writes ``to_properties()``
back. The core's own bookkeeping (``icelog.version``, ``icelog.head``, the commit-id registry
``icelog.commits`` and ``icelog.commits.files``) is written by ``storage.core.commit`` for every table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pyiceberg.table.metadata import TableMetadata


class TableState(Protocol):
    """What a commit request decides on: decoded from the base metadata, encoded back."""

    snapshot_id: int | None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> Any: ...

    def to_properties(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class SystemState:
    """A system table's state: nothing decoded; requests set properties directly."""

    snapshot_id: int | None = None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> SystemState:
        return cls(snapshot_id=metadata.current_snapshot_id)

    def to_properties(self) -> dict[str, str]:
        return {}
