"""Run the fan-out job in its own process (killed at fault points by tests).

``python -m tests.support.workers.fanout SPEC_JSON SOURCE GROUP ROUTES_JSON``
"""

from __future__ import annotations

import json
import os
import sys

from icelog.pipelines.fanout import fanout
from icelog.pipelines.spark import spark_session
from tests.support.catalogs import CatalogSpec

if __name__ == "__main__":
    spec = CatalogSpec(**json.loads(sys.argv[1]))
    os.environ.update(spec.env())
    result = fanout(
        spark_session("local[2]", "icelog-fanout-worker"),
        sys.argv[2],
        sys.argv[3],
        json.loads(sys.argv[4]),
        route_column="route",
        catalog_name=spec.name,
    )
    print(json.dumps(result.to_dict(), default=str), flush=True)
