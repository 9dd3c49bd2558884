"""What the read-only commands show of a log table, from its metadata JSON as the file holds it.

:mod:`icelog.storage.core.pointer` reads a table's current metadata without pyiceberg; this
module answers from that JSON what ``LogTable.describe``, the table's identity (uuid, format
version, partition spec, refs) and its snapshots answer through pyiceberg's models, with the
same values: a current snapshot id of -1 is none, a table with a current snapshot and no
``main`` ref has that branch, types are written as pyiceberg writes them. A table this module
cannot render exactly as pyiceberg would (a nested payload type, a partition source inside a
struct) answers None: the caller takes the full read.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Mapping

from icelog.storage.errors import UnsupportedFormat
from icelog.storage.log.names import SYSTEM_COLUMNS
from icelog.storage.log.state import LogState

MAIN_BRANCH = "main"
PRIMITIVES = frozenset(
    "boolean int long float double date time timestamp timestamptz timestamp_ns timestamptz_ns string uuid binary".split()
)
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_FIXED = re.compile(r"^fixed\[\s*(\d+)\s*\]$")


class NotPlain(Exception):
    """Something pyiceberg's models would render in a way this module does not follow."""


def type_name(field_type: Any) -> str:
    """A field's type as ``str()`` of pyiceberg's type writes it."""
    if isinstance(field_type, str):
        if field_type in PRIMITIVES:
            return field_type
        if m := _DECIMAL.match(field_type):
            return f"decimal({m[1]}, {m[2]})"
        if m := _FIXED.match(field_type):
            return f"fixed[{m[1]}]"
    raise NotPlain(f"type {field_type!r}")


def current_snapshot_id(metadata: Mapping[str, Any]) -> int | None:
    snapshot_id = metadata.get("current-snapshot-id")
    return None if snapshot_id in (None, -1) else int(snapshot_id)


def current_schema(metadata: Mapping[str, Any]) -> dict[str, Any]:
    schemas = metadata.get("schemas")
    if not schemas:
        return metadata["schema"]  # format version 1 without a schema list
    current = metadata.get("current-schema-id", schemas[0].get("schema-id"))
    return next(s for s in schemas if s.get("schema-id") == current)


def current_spec(metadata: Mapping[str, Any]) -> dict[str, Any]:
    specs = metadata.get("partition-specs")
    if not specs:
        return {"spec-id": 0, "fields": metadata.get("partition-spec", [])}
    current = metadata.get("default-spec-id", specs[0].get("spec-id"))
    return next(s for s in specs if s.get("spec-id") == current)


def refs(metadata: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Branches and tags by name, sorted: ``{"type": "branch"|"tag", "snapshot_id": id}``."""
    found = {name: {"type": r["type"], "snapshot_id": r["snapshot-id"]} for name, r in (metadata.get("refs") or {}).items()}
    current = current_snapshot_id(metadata)
    if current is not None and MAIN_BRANCH not in found:
        found[MAIN_BRANCH] = {"type": "branch", "snapshot_id": current}
    return dict(sorted(found.items()))


def describe(identifier: str, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """``LogTable.describe()`` with the table's identity (``uuid``, ``format_version``, ``spec``,
    ``refs``), or None where pyiceberg would render something differently."""
    try:
        schema = current_schema(metadata)
        fields = schema["fields"]
        names = {f["id"]: f["name"] for f in fields}
        spec = current_spec(metadata)
        state = LogState.from_properties(metadata.get("properties") or {}, metadata["location"], current_snapshot_id(metadata))
        return {
            "table": identifier,
            "partitions": state.partitions,
            "offsets": {str(p): {"start": w.start, "end": w.end} for p, w in state.watermarks.items()},
            "payload": [
                {"name": f["name"], "type": type_name(f["type"]), "required": bool(f["required"])}
                for f in fields
                if f["name"] not in SYSTEM_COLUMNS
            ],
            "snapshot_id": state.snapshot_id,
            "snapshots": len(metadata.get("snapshots") or []),
            "location": metadata["location"],
            "producers": len(state.producers),
            "uuid": str(uuid.UUID(metadata["table-uuid"])),
            "format_version": int(metadata["format-version"]),
            "spec": {
                "spec_id": spec["spec-id"],
                "fields": [
                    {"source": names[f["source-id"]], "field_id": f["field-id"], "transform": f["transform"], "name": f["name"]}
                    for f in spec["fields"]
                ],
            },
            "refs": refs(metadata),
        }
    except (NotPlain, UnsupportedFormat, KeyError, TypeError, ValueError, StopIteration):
        return None


def snapshots(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The retained snapshots, oldest first, as pyiceberg's ``metadata.snapshots`` sorted by
    (commit time, sequence number): id, parent, ``timestamp-ms`` and the summary (a dict)."""
    found = [
        {
            "snapshot_id": s["snapshot-id"],
            "parent_id": s.get("parent-snapshot-id"),
            "timestamp_ms": s["timestamp-ms"],
            "summary": s.get("summary"),
        }
        for s in metadata.get("snapshots") or []
    ]
    order = {s["snapshot-id"]: s.get("sequence-number") or 0 for s in metadata.get("snapshots") or []}
    return sorted(found, key=lambda s: (s["timestamp_ms"], order[s["snapshot_id"]]))
