"""icelog's Airflow provider: a connection type, a hook, operators, a sensor, a trigger, Assets.

Airflow finds it through the ``apache_airflow_provider`` entry point (``pyproject.toml``) and
calls :func:`get_provider_info` in every process that lists providers, so this module imports
only the standard library. What the operators run lives in ``icelog.pipelines.tasks``; they
import it when they execute, so DAG files that use them parse without pyiceberg or Spark.

    from icelog.provider.operators import IcelogIngestOperator, IcelogValidateOperator
    from icelog.provider.sensors import IcelogLogSensor
    from icelog.provider.triggers import IcelogLogTrigger
    from icelog.provider.assets import icelog_asset
"""

from __future__ import annotations

from typing import Any

CONN_TYPE = "icelog"


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` shows, and where Airflow finds the connection type and
    the ``icelog://`` Asset URIs (``airflow/provider_info.schema.json``)."""
    from icelog import __version__

    return {
        "package-name": "icelog",
        "name": "icelog",
        "description": "Kafka partition-log guarantees on Apache Iceberg tables: catalogs as connections, "
        "ingest, validate, maintain, mirror and fan-out operators, a log sensor and an event trigger.",
        "versions": [__version__],
        "integrations": [{"integration-name": "icelog", "tags": ["software"]}],
        "operators": [{"integration-name": "icelog", "python-modules": ["icelog.provider.operators"]}],
        "sensors": [{"integration-name": "icelog", "python-modules": ["icelog.provider.sensors"]}],
        "hooks": [{"integration-name": "icelog", "python-modules": ["icelog.provider.hooks"]}],
        "triggers": [{"integration-name": "icelog", "python-modules": ["icelog.provider.triggers"]}],
        "connection-types": [
            {
                "hook-class-name": "icelog.provider.hooks.IcelogHook",
                "hook-name": "icelog (Iceberg log tables)",
                "connection-type": CONN_TYPE,
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {
                        "host": "Catalog host (or the whole URI in extra 'uri')",
                        "schema": "Database (sql) or path prefix (rest)",
                        "login": "Database user (sql) / client id (rest)",
                        "password": "Database password (sql) / client secret or token (rest)",
                    },
                    "placeholders": {
                        "extra": '{"catalog_type": "sql", "warehouse": "s3://bucket/warehouse", '
                        '"s3_endpoint": "http://127.0.0.1:8333"}',
                    },
                },
                "conn-fields": {
                    "catalog_type": {
                        "label": "Catalog type",
                        "schema": {"type": ["string", "null"], "enum": ["sql", "rest", None], "default": "sql"},
                    },
                    "uri": {"label": "Catalog URI (overrides host/port/schema)", "schema": {"type": ["string", "null"]}},
                    "warehouse": {"label": "Warehouse", "schema": {"type": ["string", "null"]}},
                    "catalog_name": {"label": "Catalog name (Asset URIs)", "schema": {"type": ["string", "null"]}},
                    "s3_endpoint": {"label": "S3 endpoint", "schema": {"type": ["string", "null"]}},
                    "s3_region": {"label": "S3 region", "schema": {"type": ["string", "null"]}},
                    "s3_access_key_id": {"label": "S3 access key id", "schema": {"type": ["string", "null"]}},
                    "s3_secret_access_key": {
                        "label": "S3 secret access key",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                },
            }
        ],
        "asset-uris": [
            {
                "schemes": ["icelog"],
                "handler": "icelog.provider.assets.sanitize_uri",
                "to_openlineage_converter": "icelog.provider.lineage.convert_asset_to_openlineage",
            }
        ],
    }
