"""A mirror process for kill -9 tests: ``python -m tests.support.workers.mirror SOURCE TARGET TABLE PRINCIPAL [STEPS]``.

SOURCE and TARGET are JSON catalog specs. Runs mirror steps until killed (or STEPS done),
printing one JSON line per step.
"""

from __future__ import annotations

import json
import sys
import time

from icelog.storage.replication.mirror import mirror
from tests.support.catalogs import CatalogSpec


def main(argv: list[str]) -> int:
    source_spec, target_spec, table, principal, *rest = argv
    steps = int(rest[0]) if rest else 1_000_000
    source = CatalogSpec(**json.loads(source_spec)).open()
    target = CatalogSpec(**json.loads(target_spec)).open()
    for _ in range(steps):
        result = mirror(source, table, target, principal=principal)
        print(json.dumps({"ranges": {str(p): r for p, r in result.ranges.items()}, "up_to_date": result.up_to_date}), flush=True)
        time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
