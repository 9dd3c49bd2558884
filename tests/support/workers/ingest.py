"""Run the ingest job in its own process: ``python -m tests.support.workers.ingest SPEC TABLE SOURCE RUN_KEY``.

The Spark master comes from ICELOG_SPARK_MASTER (local[*] or a standalone cluster).
"""

from __future__ import annotations

import json
import os
import sys

from tests.support.catalogs import CatalogSpec

if __name__ == "__main__":
    spec = CatalogSpec(**json.loads(sys.argv[1]))
    os.environ.update(spec.env())
    from icelog.pipelines.ingest import ingest
    from icelog.pipelines.spark import spark_session

    result = ingest(spark_session(app_name="icelog-test"), sys.argv[2], sys.argv[3], sys.argv[4], catalog_name=spec.name)
    print(json.dumps(result.to_dict()), flush=True)
