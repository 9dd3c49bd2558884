"""Fetch and ListOffsets: record batches rebuilt from a log table's rows, and its offsets.

A fetch reads the rows of ``[fetch_offset, log end)`` (at most :data:`MAX_RECORDS` a partition)
and encodes them as uncompressed v2 batches with their exact offsets, so a fetch that starts in
the middle of what was produced as one batch gets the records from that offset on. icelog tables
hold decided data only, so the last stable offset is the high watermark and no transaction is
ever listed as aborted, under either isolation level.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway.records import encode_batch
from icelog.pipelines.gateway.topics import rows_to_records, table_name
from icelog.storage import errors
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable

MAX_RECORDS = 5_000  # per partition and fetch: bounds one read of the table
BATCH_RECORDS = 500  # records per rebuilt batch
POLL_SECONDS = 0.25  # a long poll re-reads the log end this often (other gateways' commits)
EARLIEST, LATEST = -2, -1


def _error(e: BaseException) -> ErrorCode:
    if isinstance(e, (errors.UnknownTable, errors.NotALogTable, errors.UnknownPartition, errors.InvalidIdentifier)):
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.kafka_storage_error


def read_partition(log_table: LogTable, state: LogState, partition: int, offset: int, max_bytes: int) -> dict[str, Any]:
    """One partition's fetch answer (in a thread)."""
    if partition not in state.watermarks:
        return {"partition_index": partition, "error_code": ErrorCode.unknown_topic_or_partition, "high_watermark": -1}
    mark = state.watermarks[partition]
    answer = {
        "partition_index": partition,
        "partition": partition,
        "error_code": ErrorCode.none,
        "high_watermark": mark.end,
        "last_stable_offset": mark.end,
        "log_start_offset": mark.start,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        "records": b"",
    }
    if not mark.start <= offset <= mark.end:
        return {**answer, "error_code": ErrorCode.offset_out_of_range}
    if offset == mark.end:
        return answer
    rows = log_table.read(partition, offset, min(mark.end, offset + MAX_RECORDS), snapshot_id=state.snapshot_id)
    records = rows_to_records(rows)
    out = bytearray()
    for i in range(0, len(records), BATCH_RECORDS):
        chunk = records[i : i + BATCH_RECORDS]
        out += encode_batch(chunk[0][0], chunk)
        if len(out) >= max_bytes:  # the first batch goes out whatever its size, as Kafka's does
            break
    return {**answer, "records": bytes(out)}


def read_fetch(catalog, request: Any) -> tuple[list[dict[str, Any]], int]:
    """Every partition of a fetch request, and the record bytes found (in a thread)."""
    responses, total = [], 0
    for topic in request.topics:
        name = table_name(topic.topic)
        partitions = []
        try:
            if name is None:
                raise errors.UnknownTable(table=topic.topic, catalog=catalog.name)
            log_table = LogTable(catalog, name)
            table = log_table.table()
            state = LogState.from_metadata(table.metadata)
            for p in topic.partitions:
                part = read_partition(log_table, state, p.partition, p.fetch_offset, p.partition_max_bytes)
                total += len(part.get("records") or b"")
                partitions.append(part)
        except errors.IcelogError as e:
            partitions = [
                {"partition_index": p.partition, "partition": p.partition, "error_code": _error(e), "high_watermark": -1}
                for p in topic.partitions
            ]
        responses.append({"topic": topic.topic, "name": topic.topic, "partitions": partitions})
    return responses, total


async def handle_fetch(gateway: Any, request: Any) -> dict[str, Any]:
    """Answer at once when there is data (or an error), else wait up to ``max_wait`` for commits."""
    deadline = time.monotonic() + request.max_wait.total_seconds()
    while True:
        responses, total = await asyncio.to_thread(read_fetch, gateway.catalog, request)
        failed = any(p["error_code"] != ErrorCode.none for t in responses for p in t["partitions"])
        remaining = deadline - time.monotonic()
        if total >= max(request.min_bytes, 1) or failed or remaining <= 0 or gateway.stopping:
            return {"responses": responses, "topics": responses}
        condition = gateway.appender.committed
        async with condition:
            try:
                await asyncio.wait_for(condition.wait(), min(remaining, POLL_SECONDS))
            except TimeoutError:
                pass


def list_offsets(catalog, request: Any) -> dict[str, Any]:
    """Earliest (-2), latest (-1, the high watermark) or the first offset at or after a time (in a thread).

    By time searches ``log_timestamp``, icelog's append time (``LogTable.offsets_for_time``).
    """
    topics = []
    for topic in request.topics:
        name = table_name(topic.name)
        partitions = []
        try:
            if name is None:
                raise errors.UnknownTable(table=topic.name, catalog=catalog.name)
            log_table = LogTable(catalog, name)
            state = log_table.state()
            for p in topic.partitions:
                mark = state.watermarks.get(p.partition_index)
                answer: dict[str, Any] = {"partition_index": p.partition_index, "error_code": ErrorCode.none, "timestamp": -1}
                if mark is None:
                    answer["error_code"] = ErrorCode.unknown_topic_or_partition
                elif p.timestamp == EARLIEST:
                    answer["offset"] = mark.start
                elif p.timestamp == LATEST:
                    answer["offset"] = mark.end
                elif p.timestamp < 0:
                    answer["error_code"] = ErrorCode.invalid_request
                else:
                    found = log_table.offsets_for_time(p.timestamp * 1000, [p.partition_index])[p.partition_index]
                    answer["offset"] = found.offset if found.timestamp is not None else -1
                    answer["timestamp"] = int(found.timestamp.timestamp() * 1000) if found.timestamp is not None else -1
                partitions.append(answer)
        except errors.IcelogError as e:
            partitions = [{"partition_index": p.partition_index, "error_code": _error(e)} for p in topic.partitions]
        topics.append({"name": topic.name, "partitions": partitions})
    return {"topics": topics}
