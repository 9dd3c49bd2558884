"""Mirror tests' helpers: the mirror principal, rows to append, one mirror step, the parity
assertion, concurrent mirror steps, and a race placed at an exact point of a step.

The source and target catalogs are fixtures (``tests/storage/conftest.py``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from icelog.storage.log.maintenance import live_files
from icelog.storage.log.table import LogTable
from icelog.storage.replication.mirror import mirror

PRINCIPAL = "mirror-bot"


def rows(n: int, tag: str = "v") -> list[dict]:
    return [{"key": f"k{i}", "value": f"{tag}{i}"} for i in range(n)]


def run_mirror(source, target, table="orders", **kwargs):
    return mirror(source, table, target, principal=PRINCIPAL, **kwargs)


def assert_parity(source, target, table: str = "orders") -> None:
    """Same partitions, same [log_start, log_end), same rows (every column) at each offset,
    and no data file referenced twice in the target."""
    src, dst = LogTable.open(source, table), LogTable.open(target, table)
    assert dst.watermarks() == src.watermarks()
    for p, mark in src.watermarks().items():
        a = src.read(p, mark.start, mark.end)
        b = dst.read(p, mark.start, mark.end)
        assert b.num_rows == mark.end - mark.start
        assert b.to_pylist() == a.to_pylist(), f"partition {p} differs"
    assert dst.state().producers == src.state().producers
    paths = [f.file_path for f in live_files(dst.table())]
    assert not [p for p, n in Counter(paths).items() if n > 1], "a data file is referenced twice"


def mirror_threads(source_spec, target_spec, n: int, more: Callable[[int], bool], before: Callable[[], Any] = lambda: None):
    """Start ``n`` threads, each with its own catalogs, running ``before()`` then mirror steps of
    ``orders`` while ``more(steps so far)``. Returns ``join(timeout)``: it fails on any error."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        mine_source, mine_target = source_spec.open(), target_spec.open()
        try:
            before()
            steps = 0
            while more(steps):
                mirror(mine_source, "orders", mine_target, principal=PRINCIPAL)
                steps += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()

    def join(timeout: float = 300) -> None:
        for t in threads:
            t.join(timeout)
        assert not errors, errors

    return join


def race_once(monkeypatch, name: str, race, *, skip: int = 0, before: bool = False) -> list:
    """Run ``race()`` once, right after (or ``before``) call number ``skip + 1`` of
    ``storage.replication.mirror.<name>`` (the real function still runs): a concurrent step at an exact
    point of this one."""
    import icelog.storage.replication.mirror as mirror_module

    real, calls, fired = getattr(mirror_module, name), [], []

    def wrapped(*args, **kwargs):
        calls.append(1)
        mine = len(calls) == skip + 1  # once: the race's own calls come later
        if mine and before:
            fired.append(race())
        out = real(*args, **kwargs)
        if mine and not before:
            fired.append(race())
        return out

    monkeypatch.setattr(mirror_module, name, wrapped)
    return fired
