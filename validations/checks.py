"""The registry of checks: every check takes (table, snapshot_id) and returns a CheckReport.

Later capabilities (transactions, mirrors, consumer groups) register their checks here in
the same shape, so the CLI, the validate DAG and the report pick them up unchanged.
"""

from __future__ import annotations

import time
from typing import Callable

from pyiceberg.table import Table

from icelog.storage.errors import InvalidInput
from icelog.validations.contiguity import check_contiguity
from icelog.validations.groups import check_groups
from icelog.validations.mirror import check_mirror_parity
from icelog.validations.producers import check_producers
from icelog.validations.sql import resolve_snapshot
from icelog.validations.transactions import check_transactions
from icelog.validations.violations import CheckReport

Check = Callable[[Table, "int | None"], CheckReport]

CHECKS: dict[str, Check] = {
    "contiguity": lambda table, snapshot_id: check_contiguity(table, snapshot_id=snapshot_id),
    "contiguity-deep": lambda table, snapshot_id: check_contiguity(table, deep=True, snapshot_id=snapshot_id),
    "producers": check_producers,
    "transactions": check_transactions,
    "mirror-parity": check_mirror_parity,
    "groups": check_groups,
}
DEFAULT = ("contiguity-deep", "producers", "transactions")


def register(name: str, check: Check) -> None:
    CHECKS[name] = check


def run_checks(table: Table, names: tuple[str, ...] | list[str] = DEFAULT, snapshot_id: int | None = None) -> CheckReport:
    """Run the named checks on one snapshot (default: the current one) and merge their reports.

    Raises:
        InvalidInput: no checks, or an unknown check name.
        UnknownSnapshot, HistoryExpired: ``snapshot_id`` is not retained; an empty snapshot
            would otherwise pass every check.
    """
    names = list(names)
    if not names:
        raise InvalidInput(reason=f"no checks named; known: {sorted(CHECKS)}")
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise InvalidInput(reason=f"unknown checks {unknown}; known: {sorted(CHECKS)}")
    if snapshot_id is not None:
        resolve_snapshot(table, snapshot_id)
    started = time.perf_counter()
    reports = [CHECKS[n](table, snapshot_id) for n in names]
    return CheckReport(
        table=reports[0].table,
        snapshot_id=reports[0].snapshot_id,
        checks=[c for r in reports for c in r.checks],
        violations=[v for r in reports for v in r.violations],
        rows=max(r.rows for r in reports),
        seconds=time.perf_counter() - started,
    )
