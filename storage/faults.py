"""Named fault points in the commit path, for kill -9 tests.

Production code calls :func:`checkpoint` at each point. It costs one dict lookup unless
``ICELOG_PAUSE_AT`` names that point: then the process writes its pid to
``$ICELOG_PAUSE_FILE`` and sleeps, so a test can kill it with SIGKILL right there.
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


def checkpoint(point: str) -> None:
    if os.environ.get("ICELOG_PAUSE_AT") != point:
        return
    marker = os.environ["ICELOG_PAUSE_FILE"]
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    while True:  # wait for the test's SIGKILL
        time.sleep(60)
