"""DeleteTopics, DescribeConfigs and DescribeCluster: what admin clients ask besides CreateTopics.

A topic's configs are its log table's properties, read-only (icelog sets them with
``icelog topics alter``, not through Kafka's AlterConfigs). Deleting a topic drops its log
table as ``icelog topics delete --force --yes`` does: the groups' offsets on it go first, and a
table an open transaction writes is refused.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from pyiceberg.catalog import Catalog

from icelog.pipelines.cli.topics import transactions_on
from icelog.pipelines.gateway.metadata import NODE_ID, cluster_id
from icelog.pipelines.gateway.topics import SYSTEM_NAMESPACE, table_name
from icelog.storage import errors
from icelog.storage.groups.offsets import forget_table
from icelog.storage.log.table import LogTable

TOPIC, BROKER = 2, 4  # Kafka's config resource types
TOPIC_CONFIG = 1  # config source: DYNAMIC_TOPIC_CONFIG
STRING = 2  # config type


def delete_topics(catalog: Catalog, request: Any) -> tuple[dict[str, Any], list[str]]:
    """Drop each topic's log table (in a thread); the response and the tables dropped."""
    results, dropped = [], []
    for topic in request.topic_names:
        code, message = ErrorCode.none, None
        name = table_name(topic)
        if topic.split(".")[0] == SYSTEM_NAMESPACE:
            code, message = ErrorCode.topic_authorization_failed, "icelog's system tables are never deleted"
        elif name is None:
            code, message = ErrorCode.unknown_topic_or_partition, f"{topic!r} cannot name a log table"
        else:
            try:
                log_table = LogTable(catalog, name)
                log_table.table()
                prepared, ongoing = transactions_on(catalog, name)
                if prepared or ongoing:
                    code = ErrorCode.invalid_request
                    message = f"open transactions of {', '.join(prepared + ongoing)} write {name}"
                else:
                    forget_table(catalog, name)
                    log_table.drop()
                    dropped.append(name)
            except (errors.UnknownTable, errors.NotALogTable) as e:
                code, message = ErrorCode.unknown_topic_or_partition, str(e)
            except errors.IcelogError as e:
                code, message = ErrorCode.unknown_server_error, str(e)
        results.append({"name": topic, "error_code": code, "error_message": message})
    return {"responses": results}, dropped


def describe_configs(catalog: Catalog, request: Any) -> dict[str, Any]:
    """A topic's table properties as read-only configs; a broker (this gateway, ``0``) has none (in a thread)."""
    results = []
    for resource in request.resources:
        keys = resource.configuration_keys
        entry: dict[str, Any] = {
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
            "error_code": ErrorCode.none,
            "configs": [],
        }
        if resource.resource_type == BROKER:
            if resource.resource_name not in ("", str(NODE_ID)):
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"this gateway is broker {NODE_ID}")
        elif resource.resource_type == TOPIC:
            name = table_name(resource.resource_name)
            try:
                if name is None:
                    raise errors.UnknownTable(table=resource.resource_name, catalog=catalog.name)
                props = LogTable(catalog, name).table().metadata.properties
            except errors.IcelogError as e:
                entry.update(error_code=ErrorCode.unknown_topic_or_partition, error_message=str(e))
            else:
                entry["configs"] = [
                    {
                        "name": key,
                        "value": value,
                        "read_only": True,
                        "config_source": TOPIC_CONFIG,
                        "is_sensitive": False,
                        "config_type": STRING,
                        "synonyms": [],
                    }
                    for key, value in sorted(props.items())
                    if keys is None or not keys or key in keys
                ]
        else:
            entry.update(error_code=ErrorCode.invalid_request, error_message="topics and brokers have configs here")
        results.append(entry)
    return {"results": results}


def describe_cluster(catalog: Catalog, host: str, port: int) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "endpoint_type": 1,  # brokers
        "cluster_id": cluster_id(catalog),
        "controller_id": NODE_ID,
        "brokers": [{"broker_id": NODE_ID, "host": host, "port": port, "rack": None}],
        "cluster_authorized_operations": -(2**31),
    }
