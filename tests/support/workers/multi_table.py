"""A worker that commits to two tables in one atomic commit (killed at fault points by tests).

``python -m tests.support.workers.multi_table SPEC_JSON TABLE_A TABLE_B TAG``
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from icelog.storage.core.commit import commit_tables
from icelog.storage.log.table import AppendRequest
from tests.support.catalogs import CatalogSpec


def two_table_append(catalog, a: str, b: str, tag: str, commit_id: str | None = None):
    payload = pa.table({"key": [tag], "value": [tag]})
    parts = [(t, AppendRequest(t, {0: payload}, {}, commit_id or tag)) for t in (a, b)]
    return commit_tables(catalog, parts, commit_id=commit_id or tag)


if __name__ == "__main__":
    spec, a, b, tag = sys.argv[1:5]
    outcomes = two_table_append(CatalogSpec(**json.loads(spec)).open(), a, b, tag)
    print(json.dumps([o.result.ranges[0] for o in outcomes]), flush=True)
