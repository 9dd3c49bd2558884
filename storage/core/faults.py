"""Named fault points in the commit path, for kill -9 tests and slow-writer races.

Production code calls :func:`checkpoint` at each point. Two actions can be armed, each by an
environment variable:

* ``ICELOG_PAUSE_AT=<point>``: the process writes its pid to ``$ICELOG_PAUSE_FILE`` and
  sleeps, so a test can kill it with SIGKILL right there. Read at every checkpoint, so a
  process can arm and disarm it as it goes.
* ``ICELOG_DELAY_AT=<point>:<seconds>[,<point>:<seconds>...]``: the process sleeps that long
  at the point and goes on, so other writers commit while this one is slow (e.g. a slow
  metadata write: ``after_metadata_write:2``). Read once, when this module is imported (a
  worker gets it in its environment at start); :func:`set_delays` changes it in-process.

Unarmed, a checkpoint costs one dict lookup (plus a test of an empty dict).
"""

from __future__ import annotations

import os
import time

AFTER_DATA_FILES = "after_data_files"
AFTER_METADATA_WRITE = "after_metadata_write"
AFTER_CATALOG_SWAP = "after_catalog_swap"
POINTS = (AFTER_DATA_FILES, AFTER_METADATA_WRITE, AFTER_CATALOG_SWAP)
# A multi-table commit only: inside the database transaction, between two tables' pointer swaps.
BETWEEN_TABLE_SWAPS = "between_table_swaps"
# Transactions: a partition registered in the journal (BEGIN), a send staged, PREPARE_COMMIT recorded.
AFTER_TXN_BEGIN = "after_txn_begin"
AFTER_TXN_STAGE = "after_txn_stage"
AFTER_TXN_PREPARE = "after_txn_prepare"
TXN_POINTS = (AFTER_TXN_BEGIN, AFTER_TXN_STAGE, AFTER_TXN_PREPARE, BETWEEN_TABLE_SWAPS, AFTER_CATALOG_SWAP)
# Spark ingest: executors have written the run's files, the driver has not committed them.
AFTER_INGEST_WRITE = "after_ingest_write"

PAUSE_VARIABLE = "ICELOG_PAUSE_AT"
DELAY_VARIABLE = "ICELOG_DELAY_AT"


def parse_delays(spec: str | None) -> dict[str, float]:
    """``"point:seconds,point:seconds"`` -> ``{point: seconds}``; a malformed entry raises ValueError."""
    delays: dict[str, float] = {}
    for entry in (spec or "").split(","):
        if not entry.strip():
            continue
        point, sep, seconds = entry.strip().rpartition(":")
        if not sep or not point:
            raise ValueError(f"{DELAY_VARIABLE} entries are <point>:<seconds>, not {entry!r}")
        value = float(seconds)
        if not 0 <= value < float("inf"):
            raise ValueError(f"{DELAY_VARIABLE}: seconds must be finite and >= 0, not {seconds!r}")
        delays[point] = value
    return delays


_delays: dict[str, float] = parse_delays(os.environ.get(DELAY_VARIABLE))


def set_delays(spec: str | None) -> None:
    """Arm (or, with ``None``, disarm) delays in this process, in ``ICELOG_DELAY_AT``'s format."""
    global _delays
    _delays = parse_delays(spec)


def checkpoint(point: str) -> None:
    if _delays and point in _delays:
        time.sleep(_delays[point])
    if os.environ.get(PAUSE_VARIABLE) != point:
        return
    marker = os.environ["ICELOG_PAUSE_FILE"]
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    while True:  # wait for the test's SIGKILL
        time.sleep(60)
