"""Tables as a writer last read or committed them: the first base of its next commit.

A writer's steady stream need not read the table's metadata before every commit: the table
its last commit left is, most of the time, still the table. The commit core's compare-and-swap
proves it (a base that moved on loses the swap), and any error or no-write decision made on it
is decided again on a fresh read (``storage.core.commit.commit_tables``, ``loaded``).
"""

from __future__ import annotations

import time

from pyiceberg.table import Table

# Long enough for a writer's steady stream, short against the lifetime of a REST catalog's
# vended storage credentials (a cached table's FileIO holds them).
SEEN_MAX_AGE_S = 30.0


class LastSeen:
    """Per table identifier, the table as last read or committed here, for ``SEEN_MAX_AGE_S``."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[Table, float]] = {}

    def put(self, identifier: str, table: Table | None) -> None:
        if table is not None:
            self._tables[identifier] = (table, time.monotonic())

    def forget(self, identifier: str) -> None:
        self._tables.pop(identifier, None)

    def get(self, identifier: str) -> Table | None:
        seen = self._tables.get(identifier)
        return seen[0] if seen is not None and time.monotonic() - seen[1] <= SEEN_MAX_AGE_S else None

    def all(self, identifiers: list[str]) -> dict[str, Table] | None:
        """Every one of ``identifiers``, or None if any is unknown or too old (a commit's bases
        come all from here or all from the catalog)."""
        found = {ident: self.get(ident) for ident in identifiers}
        return None if any(t is None for t in found.values()) else found  # type: ignore[return-value]
