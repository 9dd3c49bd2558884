"""The lakehouse profile for tests: a PostgreSQL SQL catalog whose warehouse is an S3 bucket.

SeaweedFS's ``warehouse`` bucket is an S3 *table bucket* (Iceberg's layout only, behind its REST
catalog); a SQL catalog's warehouse and the landing files live in a normal bucket of the same
server, made with the same keys. The SQL catalog keeps atomic multi-table commits (ingest's data and
ledger in one commit); on the REST catalog the ledger rolls forward after the data instead.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.catalogs import CatalogSpec

BUCKET = "lakehouse"
S3_KEYS = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region")


def s3_properties(seaweedfs_config: dict[str, str]) -> dict[str, str]:
    """The FileIO properties (endpoint, keys, region) of a SeaweedFS server's S3 gateway."""
    return {key: seaweedfs_config[key] for key in S3_KEYS}


def s3_filesystem(s3: dict[str, str]):
    """A pyarrow S3 filesystem on the gateway named by the ``s3.*`` properties (may create buckets)."""
    from urllib.parse import urlparse

    from pyarrow import fs

    endpoint = urlparse(s3["s3.endpoint"])
    return fs.S3FileSystem(
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        access_key=s3["s3.access-key-id"],
        secret_key=s3["s3.secret-access-key"],
        region=s3["s3.region"],
        allow_bucket_creation=True,
    )


def ensure_bucket(s3: dict[str, str], bucket: str = BUCKET) -> None:
    """Create the normal bucket ``bucket`` unless it exists (idempotent)."""
    s3_filesystem(s3).create_dir(bucket)


@dataclass(frozen=True)
class LakehouseSpec(CatalogSpec):
    """A PostgreSQL catalog with an S3 warehouse; the ``s3.*`` properties ride in ``rest``."""

    def open(self):
        from icelog.storage.core.catalog import LogSqlCatalog

        return LogSqlCatalog(self.name, **self.properties())

    @property
    def s3(self) -> dict[str, str]:
        return dict(self.rest)


def lakehouse_spec(seaweedfs_config: dict[str, str], postgres_uri: str, bucket: str = BUCKET) -> LakehouseSpec:
    """A fresh catalog (its own name and warehouse prefix) on the session's PostgreSQL and SeaweedFS.

    Args:
        seaweedfs_config: The ``seaweedfs_server`` fixture's configuration (``infra.seaweedfs.start``).
        postgres_uri: The ``postgres_server`` fixture's SQLAlchemy URI.
        bucket: The normal bucket to hold the warehouse (created if need be).
    """
    s3 = s3_properties(seaweedfs_config)
    ensure_bucket(s3, bucket)
    name = f"lh{uuid.uuid4().hex[:10]}"
    return LakehouseSpec("postgres", name, postgres_uri, f"s3://{bucket}/{name}/wh", tuple(sorted(s3.items())))


def land(spec: LakehouseSpec, landing: str, files: int = 3, rows: int = 200) -> list[dict]:
    """Parquet landing files written straight to the object store; their rows."""
    filesystem = s3_filesystem(spec.s3)
    prefix = landing.removeprefix("s3://")
    everything = []
    for f in range(files):
        batch = [{"key": f"k{(f * 7 + i) % 23}", "value": f"f{f}-{i}"} for i in range(rows)]
        pq.write_table(pa.Table.from_pylist(batch), f"{prefix}/part-{f}.parquet", filesystem=filesystem)
        everything += batch
    return everything
