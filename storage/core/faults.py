"""Named fault points in the commit path, for kill -9 tests and slow-writer races.

Production code calls :func:`checkpoint` at each point. Two actions can be armed, each by an
environment variable:

* ``ICELOG_PAUSE_AT=<point>``: the process writes its pid to ``$ICELOG_PAUSE_FILE`` and
  sleeps, so a test can kill it with SIGKILL right there. :func:`set_pause` arms and disarms
  it in-process as a worker goes.
* ``ICELOG_DELAY_AT=<point>:<seconds>[,<point>:<seconds>...]``: the process sleeps that long
  at the point and goes on, so other writers commit while this one is slow (e.g. a slow
  metadata write: ``after_metadata_write:2``). :func:`set_delays` changes it in-process.

Both are read once, through ``storage.settings``, when this module is imported (a worker gets
them in its environment at start).

Unarmed, a checkpoint costs one dict lookup (plus a test of an empty dict).
"""

from __future__ import annotations

import os
import time

from icelog.storage import settings

AFTER_DATA_FILES = "after_data_files"
AFTER_METADATA_WRITE = "after_metadata_write"
AFTER_CATALOG_SWAP = "after_catalog_swap"
POINTS = (AFTER_DATA_FILES, AFTER_METADATA_WRITE, AFTER_CATALOG_SWAP)
# A commit has written a commit-id registry file (its tail outgrew the metadata), not swapped yet.
AFTER_REGISTRY_FILE = "after_registry_file"
# A multi-table commit only: inside the database transaction, between two tables' pointer swaps.
BETWEEN_TABLE_SWAPS = "between_table_swaps"
# Transactions: a new partition sent to (registered in the journal without atomic multi-table
# commits), a send staged, the commit begun: PREPARE_COMMIT recorded without atomic commits; with
# them (no PREPARE_COMMIT), nothing written yet: the one swap is still to come.
AFTER_TXN_BEGIN = "after_txn_begin"
AFTER_TXN_STAGE = "after_txn_stage"
AFTER_TXN_PREPARE = "after_txn_prepare"
TXN_POINTS = (AFTER_TXN_BEGIN, AFTER_TXN_STAGE, AFTER_TXN_PREPARE, BETWEEN_TABLE_SWAPS, AFTER_CATALOG_SWAP)
# Spark ingest: executors have written the run's files, the driver has not committed them.
AFTER_INGEST_WRITE = "after_ingest_write"
# Spark ingest on a catalog without atomic multi-table commits: the data committed, its ledger not yet.
AFTER_INGEST_DATA_COMMIT = "after_ingest_data_commit"

PAUSE_VARIABLE = settings.PAUSE_AT.name
DELAY_VARIABLE = settings.DELAY_AT.name


def parse_delays(spec: str | None) -> dict[str, float]:
    """``"point:seconds,point:seconds"`` -> ``{point: seconds}``.

    Raises:
        InvalidSetting: a malformed entry (a ``ValueError``).
    """
    return settings.fault_delays(settings.DELAY_AT, spec or "")


_delays: dict[str, float] = settings.DELAY_AT.read() or {}
_pause_at: str | None = settings.PAUSE_AT.read()
_pause_file: str | None = settings.PAUSE_FILE.read()


def set_delays(spec: str | None) -> None:
    """Arm (or, with ``None``, disarm) delays in this process, in ``ICELOG_DELAY_AT``'s format."""
    global _delays
    _delays = parse_delays(spec)


def set_pause(point: str | None, marker: str | None = None) -> str | None:
    """Arm the pause at ``point`` (``None``: disarm) in this process, writing the pid to ``marker``
    (default: the file armed before); returns the point armed before."""
    global _pause_at, _pause_file
    before, _pause_at = _pause_at, point
    _pause_file = marker or _pause_file
    return before


def checkpoint(point: str) -> None:
    if _delays and point in _delays:
        time.sleep(_delays[point])
    if _pause_at != point:
        return
    marker = _pause_file
    if marker is None:
        raise settings.PAUSE_FILE.malformed("", f"unset while {PAUSE_VARIABLE}={point} is armed")
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    while True:  # wait for the test's SIGKILL
        time.sleep(60)
