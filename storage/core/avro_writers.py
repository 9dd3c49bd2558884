"""pyiceberg's Avro writers with their schema work done once per schema, not once per file.

Every commit writes a manifest and a manifest list, and pyiceberg 0.12 derives each file's Iceberg
schema, its Avro schema and its writer tree anew, in pure Python: about 2 ms of CPU per table
committed, two thirds of writing a one-entry manifest. A transaction pays it once per table.
The results depend only on the schemas (frozen models), the Avro writers hold no state, and
the schema pyiceberg puts in a file's header is only serialized: one of each, kept, gives the
same bytes (``tests/storage/core/test_avro_writers.py``).

:func:`install` (run once, by the commit core's import) puts the kept versions where pyiceberg's
writers look them up.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from pyiceberg import manifest
from pyiceberg.avro import file as avro_file

_lock = threading.Lock()
_installed = False
_KEEP = 512  # distinct schemas kept; a process sees a handful (one per partition type and format)


class _BySchema:
    """Results of a function of schemas, keyed by the schemas' identity. A kept entry holds its
    schemas, so an id is never reused while its entry stands."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.kept: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}

    def __call__(self, *schemas: Any, **named: Any) -> Any:
        key = (*map(id, schemas), *((k, id(v)) for k, v in sorted(named.items())))
        found = self.kept.get(key)
        if found is not None:
            return found[1]
        result = self.fn(*schemas, **named)
        if len(self.kept) >= _KEEP:
            self.kept.clear()
        self.kept[key] = ((*schemas, *named.values()), result)
        return result


def install() -> None:
    """Make pyiceberg's Avro file writer and manifest writer reuse their schema work (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        conversion = avro_file.AvroSchemaConversion

        class _KeptConversion(conversion):  # type: ignore[misc, valid-type]
            """Avro schemas of Iceberg schemas, each converted once (the header only serializes it)."""

            _kept = _BySchema(lambda schema, schema_name: conversion().iceberg_to_avro(schema, schema_name=schema_name))

            def iceberg_to_avro(self, schema: Any, schema_name: str | None = None) -> Any:
                return self._kept(schema, schema_name=schema_name)

        avro_file.resolve_writer = _BySchema(avro_file.resolve_writer)
        avro_file.construct_writer = _BySchema(avro_file.construct_writer)
        avro_file.AvroSchemaConversion = _KeptConversion
        manifest.ManifestWriter._with_partition = _with_partition(manifest.ManifestWriter._with_partition)
        _installed = True


def _with_partition(build: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A manifest's entry schema, built once per (format version, partition type): the one schema
    object the keyed Avro work above then finds again."""
    kept: dict[tuple[Any, str], Any] = {}

    def with_partition(writer: Any, format_version: Any) -> Any:
        key = (format_version, repr(writer._spec.partition_type(writer._schema)))
        found = kept.get(key)
        if found is None:
            found = build(writer, format_version)
            if len(kept) >= _KEEP:
                kept.clear()
            kept[key] = found
        return found

    return with_partition
