"""The tests' Spark session: ``local[2]`` (two cores, like the CI machine), one per test process.

The ``spark`` fixture (``tests/conftest.py``) hands it to tests and stops it at the end of the
run; a helper outside a test (a job runner) gets the same session, since Spark keeps one per
process (``getOrCreate``).
"""

from __future__ import annotations

from icelog.pipelines.spark import spark_session


def local_session():
    """The shared ``local[2]`` SparkSession (created on first use)."""
    return spark_session("local[2]", "icelog-tests")
