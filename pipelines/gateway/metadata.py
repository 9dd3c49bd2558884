"""ApiVersions, Metadata, FindCoordinator, InitProducerId and CreateTopics: what a client asks before it produces or fetches.

The gateway is one broker (node 0) that leads every partition of every topic: any number of
gateway processes may serve one catalog, each telling its clients it is the whole cluster.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway import wire
from icelog.pipelines.gateway.topics import SYSTEM_NAMESPACE, create_topic, table_name
from icelog.storage import errors
from icelog.storage.log.table import LogTable, list_log_tables
from icelog.storage.producers.idempotent import lease_producer_ids

NODE_ID = 0
GROUP_KEY, TRANSACTION_KEY = 0, 1  # FindCoordinator's key types: a consumer group, a transactional id


def api_versions(request: Any) -> dict[str, Any]:
    return {"error_code": ErrorCode.none, "api_keys": wire.served()}


def metadata(catalog, request: Any, host: str, port: int) -> dict[str, Any]:
    """Brokers (this gateway) and the asked topics, or every log table outside ``icelog_system`` (in a thread)."""
    if request.topics is None:
        names = [n for n in list_log_tables(catalog) if not n.startswith(SYSTEM_NAMESPACE + ".")]
    else:
        names = [t.name for t in request.topics]
    topics = []
    for topic in names:
        entry: dict[str, Any] = {"name": topic, "error_code": ErrorCode.none, "partitions": []}
        name = table_name(topic) if topic is not None else None
        try:
            if name is None:
                raise errors.UnknownTable(table=str(topic), catalog=catalog.name)
            count = LogTable(catalog, name).state().partitions
        except errors.IcelogError:
            entry["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            entry["partitions"] = [
                {
                    "error_code": ErrorCode.none,
                    "partition_index": p,
                    "leader_id": NODE_ID,
                    "leader_epoch": 0,
                    "replica_nodes": [NODE_ID],
                    "isr_nodes": [NODE_ID],
                }
                for p in range(count)
            ]
        topics.append(entry)
    return {
        "brokers": [{"node_id": NODE_ID, "host": host, "port": port}],
        "cluster_id": cluster_id(catalog),
        "controller_id": NODE_ID,
        "topics": topics,
    }


def cluster_id(catalog) -> str:
    return f"icelog-{catalog.name}"


def find_coordinator(request: Any, version: int, host: str, port: int) -> dict[str, Any]:
    """This gateway coordinates every group (key type 0) and every transactional id (key type 1)."""
    keys = list(request.coordinator_keys) if version >= 4 else [request.key]
    found = []
    for key in keys:
        if getattr(request, "key_type", GROUP_KEY) not in (GROUP_KEY, TRANSACTION_KEY):
            found.append({"key": key, "error_code": ErrorCode.invalid_request, "error_message": "key type 0 or 1",
                          "node_id": -1, "host": "", "port": -1})  # fmt: skip
        else:
            found.append({"key": key, "error_code": ErrorCode.none, "node_id": NODE_ID, "host": host, "port": port})
    return {"coordinators": found} if version >= 4 else found[0]


def init_producer_id(catalog, request: Any) -> dict[str, Any]:
    """A fresh icelog producer id at epoch 0 for an idempotent producer (in a thread).

    A request that names its current id and epoch (a client bumping its epoch) also gets a fresh
    id. A transactional id's request goes to ``transactions.Transactions.init``.
    """
    try:
        producer_id = lease_producer_ids(catalog, 1)[0]
    except errors.IcelogError:
        return {"error_code": ErrorCode.kafka_storage_error, "producer_id": -1, "producer_epoch": -1}
    return {"error_code": ErrorCode.none, "producer_id": producer_id, "producer_epoch": 0}


def create_topics(catalog, request: Any) -> dict[str, Any]:
    """Create each topic's log table with the Kafka record schema (in a thread).

    A partition count of -1 means 1. The replication factor is not icelog's to choose (the
    object store keeps the data) and is ignored; replica assignments and topic configs are
    refused (INVALID_REQUEST, INVALID_CONFIG) rather than silently dropped.
    """
    results = []
    for topic in request.topics:
        code, message = ErrorCode.none, None
        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
        name = table_name(topic.name)
        if topic.name.split(".")[0] == SYSTEM_NAMESPACE:
            code, message = ErrorCode.topic_authorization_failed, "icelog's system tables are not writable"
        elif name is None:
            code, message = ErrorCode.invalid_topic_exception, "a topic is NAMESPACE.TABLE or TABLE: letters, digits and _"
        elif topic.assignments:
            code, message = ErrorCode.invalid_request, "replica assignments are not served: the object store keeps the data"
        elif topic.configs:
            code, message = ErrorCode.invalid_config, "topic configs are not served yet"
        elif not 1 <= partitions <= 100_000:
            code, message = ErrorCode.invalid_partitions, f"partitions must be in 1..100000, not {topic.num_partitions}"
        elif request.validate_only:
            if catalog.table_exists(name):
                code, message = ErrorCode.topic_already_exists, f"{name} exists"
        else:
            try:
                create_topic(catalog, name, partitions)
            except errors.TableAlreadyExists as e:
                code, message = ErrorCode.topic_already_exists, str(e)
            except errors.IcelogError as e:
                code, message = ErrorCode.invalid_request, str(e)
        results.append(
            {
                "name": topic.name,
                "error_code": code,
                "error_message": message,
                "num_partitions": partitions if code == ErrorCode.none else -1,
                "replication_factor": 1 if code == ErrorCode.none else -1,
                "configs": [],
            }
        )
    return {"topics": results}
