"""SparkSession factory and reading log tables in Spark.

Spark is the data plane: executors read sources and the data files pyiceberg plans for a
snapshot, and write Parquet; the driver only commits (through ``storage``).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping
from urllib.parse import urlparse

from icelog.storage.errors import InvalidInput
from icelog.storage.extras import require
from icelog.storage.log import schema as cols
from icelog.storage.log.files import arrow_location
from icelog.storage.settings import Settings
from icelog.storage.telemetry import get_logger

log = get_logger("spark")
# The driver JVM's Log4j 2 settings: "LEVEL logger: message" lines on stderr (see the file).
LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
_JVM_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) (\S+): (.*)$")
_JVM_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING}
# Printed by the JVM itself (not Log4j) because Spark's launcher adds jdk.incubator.vector.
_JVM_BANNERS = ("WARNING: Using incubator modules",)


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


def spark_session(
    master: str | None = None,
    app_name: str = "icelog",
    conf: dict[str, str] | None = None,
    settings: Settings | None = None,
):
    """Get or create a SparkSession.

    Args:
        master: Spark master URL; default the settings' (``$ICELOG_SPARK_MASTER``, else
            ``local[*]``). A standalone (``spark://host:7077``) or Kubernetes (``k8s://...``)
            master works unchanged.
        app_name: Shown in the Spark UI.
        conf: Extra Spark settings.
        settings: The entry point's settings (default: loaded now): the master, shuffle
            partitions, driver memory and log level.
    """
    settings = settings or Settings.load()
    require("pyspark", "Spark (ingest, fan-out, consume-produce, the Spark engine)")
    check_java()
    # Bind the driver to loopback unless told otherwise: a one-machine default should not
    # advertise itself on whatever interface the hostname resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors run icelog's Arrow numbering in Python: the same interpreter (and packages)
    # as the driver, unless the deployment says otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    master = master or settings.spark_master
    spark_conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.sql.session.timeZone": "UTC",
        # Iceberg and DuckDB read microsecond timestamps; Spark's default INT96 is legacy.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.ui.showConsoleProgress": "false",
        # One input split never packs two files, so ingest can number rows in file order
        # without a shuffle (pipelines.ingest.slice_bases).
        "spark.sql.files.maxPartitionBytes": "134217728",
        "spark.sql.files.openCostInBytes": "134217728",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.driver.memory": settings.spark_driver_memory,
        # Read when the JVM starts: setLogLevel below would come after the startup warnings.
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}",
        **(conf or {}),
    }
    _launch_driver_jvm(spark_conf)
    builder = SparkSession.builder
    for key, value in spark_conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings.spark_log_level)
    return session


def _launch_driver_jvm(settings: Mapping[str, str]) -> None:
    """Start the driver JVM (once per process) with its stderr read into Python's logging.

    An Airflow task's stderr is logged as ERROR, line by line: Spark's warnings, and the
    JVM's own start-up banner, showed red in every successful task. Through this pipe each
    Log4j line is logged by ``icelog.spark`` at its own level (the banner at DEBUG), so the
    task log, ``dags test`` and the CLI all filter it like any other log.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # The class attribute is PySpark's own "JVM already started" check (SparkContext._ensure_initialized);
    # an outer launcher (PYSPARK_GATEWAY_PORT, e.g. spark-submit) owns its JVM's stderr.
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    # Read from the start: a JVM that fails to start says why only there.
    read_end, write_end = os.pipe()
    threading.Thread(target=forward_jvm_log, args=(os.fdopen(read_end, "rb"),), name="spark-jvm-log", daemon=True).start()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
    finally:
        os.close(write_end)  # the JVM holds its own copy; the reader ends when the JVM does
    SparkContext(conf=conf, gateway=gateway)


def forward_jvm_log(stream: IO[bytes]) -> None:
    """Log each line the driver JVM writes to ``stream`` (its stderr) until it closes.

    A Log4j line (``LEVEL logger: message``, :data:`LOG4J2_PROPERTIES`) is logged at its level
    with the JVM logger's name; a stack trace's lines follow their event at its level; anything
    else the JVM prints (a crash, a fatal start-up error) is a warning, its known banners debug.
    """
    level = logging.WARNING
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip()
        if not line:
            continue
        found = _JVM_LINE.match(line)
        if found:
            level = _JVM_LEVELS.get(found[1], logging.ERROR)
            log.log(level, found[3], jvm_logger=found[2])
        elif line.startswith(_JVM_BANNERS):
            log.debug(line)
        else:
            log.log(level, line)
    stream.close()


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
    arrow = sparkable_schema(iceberg.schema().as_arrow())
    schema = spark_schema(arrow)
    if not paths:
        return spark.createDataFrame([], schema)
    if is_local(paths[0]):
        df = spark.read.schema(schema).parquet(*paths)
    else:  # an object store (a REST catalog's warehouse): executors read through pyarrow
        reader = LogFileReader(sorted(paths), file_io_properties(iceberg.io.properties), arrow)
        df = spark.range(0, len(paths), 1, len(paths)).mapInArrow(reader, schema)
    if partition is not None:
        df = df.where(F.col(cols.PARTITION) == partition)
    if start is not None:
        df = df.where(F.col(cols.OFFSET) >= start)
    if end is not None:
        df = df.where(F.col(cols.OFFSET) < end)
    return df


@dataclass(frozen=True)
class LogFileReader:
    """On the executors: read a log table's data files from an object store with pyarrow, one task
    per file (``mapInArrow`` over ``spark.range``), as the table's FileIO settings reach it: Spark
    has no object-store connector here. Rows come in the Arrow ``schema`` Spark was given."""

    paths: list[str]
    io_properties: dict[str, str]
    schema: Any

    def __call__(self, batches: Any) -> Any:
        import pyarrow.parquet as pq

        for batch in batches:
            for index in batch.column("id").to_pylist():
                filesystem, where = executor_filesystem(self.io_properties, self.paths[index])
                rows = pq.read_table(where, filesystem=filesystem, columns=self.schema.names)
                yield from rows.select(self.schema.names).cast(self.schema).to_batches()


def sparkable_schema(schema: Any) -> Any:
    """Columns as types Spark takes from Arrow: all-null columns as strings, dictionaries as their
    values, large strings and binaries as plain ones."""
    import pyarrow as pa

    def plain(t: Any) -> Any:
        if pa.types.is_dictionary(t):
            return plain(t.value_type)
        if pa.types.is_null(t) or pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        return t

    return pa.schema([pa.field(f.name, plain(f.type)) for f in schema])


def spark_schema(arrow_schema: Any):
    """The Spark schema of an Arrow schema (via pyspark's own type mapping)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)
