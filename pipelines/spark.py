"""SparkSession factory and reading log tables in Spark.

Spark is the data plane: executors read sources and the data files pyiceberg plans for a
snapshot, and write Parquet; the driver only commits (through ``storage``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Any, Mapping
from urllib.parse import urlparse

from storage.errors import InvalidInput
from storage.log import schema as cols
from storage.log.files import arrow_location


class SparkUnavailable(InvalidInput):
    message = "cannot start Spark: {reason}"


# The FileIO settings executors need to reach an object store (endpoint, keys, region, the FileIO
# class); a catalog's own settings (its database URI and password) stay on the driver.
FILE_IO_PREFIXES = ("s3.", "gcs.", "adls.", "hdfs.", "client.", "py-io-impl")


def is_local(uri: str) -> bool:
    """A local path (``/x``, ``file:/x``, ``file:///x``), not an object store's URI."""
    return urlparse(uri).scheme in ("", "file")


def file_io_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The FileIO settings among a table's (``table.io.properties``) or a catalog's properties,
    to ship to executors: they build the same FileIO there (:func:`executor_filesystem`)."""
    return {k: str(v) for k, v in properties.items() if k.startswith(FILE_IO_PREFIXES)}


def executor_filesystem(io_properties: Mapping[str, str], uri: str) -> tuple[Any, str]:
    """On an executor: the pyarrow filesystem serving ``uri`` with the shipped FileIO settings,
    and the path of ``uri`` in it (``bucket/key`` on S3).

    Spark itself never reads or writes an object store's URI (no Hadoop S3 connector is
    needed): executors go through pyarrow, configured exactly as the table's FileIO.
    """
    return arrow_location(_file_io(tuple(sorted(io_properties.items()))), uri)


@functools.lru_cache(maxsize=8)
def _file_io(properties: tuple[tuple[str, str], ...]) -> Any:
    """One FileIO per configuration and executor process: its filesystems (connection pools) are reused."""
    from pyiceberg.io import load_file_io

    return load_file_io(dict(properties))


def check_java() -> str:
    """Return the java executable Spark will use, or raise :class:`SparkUnavailable`."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailable(
            reason="no Java runtime: install OpenJDK 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    version = subprocess.run([java, "-version"], capture_output=True, text=True)
    if version.returncode != 0:
        raise SparkUnavailable(reason=f"{java} -version failed: {version.stderr.strip()[:200]}")
    return java


def spark_session(master: str | None = None, app_name: str = "icelog", conf: dict[str, str] | None = None):
    """Get or create a SparkSession.

    Args:
        master: Spark master URL; default ``$ICELOG_SPARK_MASTER`` or ``local[*]``. A
            standalone (``spark://host:7077``) or Kubernetes (``k8s://...``) master works unchanged.
        app_name: Shown in the Spark UI.
        conf: Extra Spark settings.
    """
    check_java()
    # Bind the driver to loopback unless told otherwise: a one-machine default should not
    # advertise itself on whatever interface the hostname resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors run icelog's Arrow numbering in Python: the same interpreter (and packages)
    # as the driver, unless the deployment says otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = master or os.environ.get("ICELOG_SPARK_MASTER", "local[*]")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        # Iceberg and DuckDB read microsecond timestamps; Spark's default INT96 is legacy.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .config("spark.sql.shuffle.partitions", os.environ.get("ICELOG_SPARK_SHUFFLE_PARTITIONS", "8"))
        .config("spark.ui.showConsoleProgress", "false")
        # One input split never packs two files, so ingest can number rows in file order
        # without a shuffle (pipelines.ingest.slice_bases).
        .config("spark.sql.files.maxPartitionBytes", "134217728")
        .config("spark.sql.files.openCostInBytes", "134217728")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.driver.memory", os.environ.get("ICELOG_SPARK_DRIVER_MEMORY", "2g"))
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("ICELOG_SPARK_LOG_LEVEL", "WARN"))
    return session


def read_log(
    spark: Any,
    table: Any,
    partition: int | None = None,
    start: int | None = None,
    end: int | None = None,
    snapshot_id: int | None = None,
):
    """A log table (or one partition's offset range) as a Spark DataFrame.

    pyiceberg plans the files (pruning by partition and offset bounds); Spark's executors
    read them. ``table`` is a :class:`storage.log.table.LogTable`.
    """
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual, LessThan
    from pyspark.sql import functions as F

    iceberg = table.table()
    condition: Any = AlwaysTrue()
    if partition is not None:
        condition = And(condition, EqualTo(cols.PARTITION, partition))
    if start is not None:
        condition = And(condition, GreaterThanOrEqual(cols.OFFSET, start))
    if end is not None:
        condition = And(condition, LessThan(cols.OFFSET, end))
    paths = [t.file.file_path for t in iceberg.scan(row_filter=condition, snapshot_id=snapshot_id).plan_files()]
    schema = spark_schema(iceberg.schema().as_arrow())
    if not paths:
        return spark.createDataFrame([], schema)
    df = spark.read.schema(schema).parquet(*paths)
    if partition is not None:
        df = df.where(F.col(cols.PARTITION) == partition)
    if start is not None:
        df = df.where(F.col(cols.OFFSET) >= start)
    if end is not None:
        df = df.where(F.col(cols.OFFSET) < end)
    return df


def spark_schema(arrow_schema: Any):
    """The Spark schema of an Arrow schema (via pyspark's own type mapping)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)
