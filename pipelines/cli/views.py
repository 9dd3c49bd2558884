"""``icelog snapshots``, ``files``, ``schema`` and ``catalog``: read-only views of the lakehouse,
as pyiceberg's CLI offers them, in icelog's words (offsets, partitions, commit ids).

Every command here reads: none creates a namespace, a table or a folder. ``catalog`` does not
even open the catalog; it reports the configuration another tool (pyiceberg, DuckDB, Spark)
needs to reach it.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from pathlib import Path
from typing import Any

import click

from icelog.pipelines.cli.app import POSITIVE_INT64, Context, print_table
from icelog.storage.settings import Settings

SECRET = "****"


def _committed_at(timestamp_ms: int) -> str:
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")


def _snapshot_row(snapshot_id: int, parent_id: int | None, timestamp_ms: int, summary: Any) -> dict[str, Any]:
    """One snapshot's row; ``summary`` a mapping of its summary (``operation`` among its keys), or None."""
    from icelog.storage.properties import COMMIT_ID

    added = summary.get("added-records") if summary is not None else None
    operation = summary.get("operation") if summary is not None else None
    return {
        "snapshot_id": snapshot_id,
        "parent_id": parent_id,
        "committed_at": _committed_at(timestamp_ms),
        "operation": getattr(operation, "value", operation),  # pyiceberg's Operation, or the file's string
        "commit_id": summary.get(COMMIT_ID) if summary is not None else None,  # None: not an icelog commit
        "records_added": int(added) if added is not None else 0,
    }


@click.command()
@click.argument("table")
@click.option("--limit", type=POSITIVE_INT64, default=None, help="Only the newest N snapshots.")
@click.pass_obj
def snapshots(ctx: Context, table: str, limit: int | None) -> None:
    """TABLE's retained snapshots, newest last: id, parent, time (UTC), operation, icelog commit id, records added."""
    from icelog.storage.log import plain_metadata

    light = ctx.light_metadata(table)
    if light is not None:
        identifier, metadata = light
        history = [
            (s["snapshot_id"], s["parent_id"], s["timestamp_ms"], s["summary"]) for s in plain_metadata.snapshots(metadata)
        ]
    else:
        from icelog.storage.log.table import LogTable

        log_table = LogTable.open(ctx.catalog, table)
        identifier = log_table.identifier
        ordered = sorted(log_table.table().metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
        history = [(s.snapshot_id, s.parent_snapshot_id, s.timestamp_ms, s.summary) for s in ordered]
    rows = [_snapshot_row(*s) for s in history[-limit if limit else None :]]
    ctx.emit(
        rows,
        lambda d: print_table(
            [
                [
                    r["snapshot_id"],
                    r["parent_id"] or "",
                    r["committed_at"],
                    r["operation"],
                    r["commit_id"] or "",
                    r["records_added"],
                ]
                for r in d
            ],
            ["snapshot", "parent", "committed at", "operation", "commit id", "records added"],
            identifier,
            empty="snapshots yet",
        ),
    )


@click.command()
@click.argument("table")
@click.pass_obj
def files(ctx: Context, table: str) -> None:
    """TABLE's current data files by partition and offset: path, first and last offset, records, bytes."""
    from icelog.storage.log.maintenance import files_by_partition
    from icelog.storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    rows = [
        {
            "path": data_file.file_path,
            "partition": partition,
            "first_offset": first,
            "last_offset": nxt - 1,
            "records": data_file.record_count,
            "bytes": data_file.file_size_in_bytes,
        }
        for partition, entries in sorted(files_by_partition(log_table.table()).items())
        for first, nxt, data_file in entries
    ]
    ctx.emit(
        rows,
        lambda d: print_table(
            [[r["partition"], r["first_offset"], r["last_offset"], r["records"], r["bytes"], r["path"]] for r in d],
            ["partition", "first offset", "last offset", "records", "bytes", "path"],
            log_table.identifier,
            empty="data files",
        ),
    )


@click.command()
@click.argument("table")
@click.pass_obj
def schema(ctx: Context, table: str) -> None:
    """TABLE's Iceberg schema: field id, name, type, required, and whether icelog owns the column."""
    from icelog.storage.log.schema import SYSTEM_COLUMNS
    from icelog.storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    rows = [
        {
            "id": f.field_id,
            "name": f.name,
            "type": str(f.field_type),
            "required": f.required,
            "system": f.name in SYSTEM_COLUMNS,
        }
        for f in log_table.table().schema().fields
    ]
    ctx.emit(
        rows,
        lambda d: print_table(
            [
                [r["id"], r["name"], r["type"], "required" if r["required"] else "optional", "system" if r["system"] else ""]
                for r in d
            ],
            ["id", "name", "type", "required", "system"],
            log_table.identifier,
        ),
    )


def mask_password(uri: str) -> str:
    """``uri`` with the password of its user info replaced by ``****``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{SECRET}@{host}"))


def catalog_settings(name: str | None, settings: Settings | None = None) -> dict[str, Any]:
    """What ``open_catalog(name, settings=settings)`` would connect to, without connecting or
    creating anything (``settings``: default loaded now).

    Raises:
        CatalogNotConfigured: ``name`` has no configuration.
    """
    from icelog.storage.core.catalog_config import EMBEDDED_DATABASE, choose_catalog

    choice = choose_catalog(name, settings or Settings.load())
    conf, home = choice.properties, choice.home
    if choice.embedded:
        doc = _settings(choice.name, "sql", conf["uri"], conf["warehouse"], home, embedded=True)
        # Reads never create the embedded catalog: say whether a write has created it yet.
        doc["exists"] = (home / EMBEDDED_DATABASE).is_file()
        return doc
    uri = str(conf.get("uri", ""))
    kind = str(conf.get("type") or _infer_type(uri))
    return _settings(choice.name, kind, uri, conf.get("warehouse"), home, embedded=False)


def _infer_type(uri: str) -> str:
    for prefix, kind in (("http", "rest"), ("thrift", "hive"), ("sqlite", "sql"), ("postgresql", "sql")):
        if uri.startswith(prefix):
            return kind
    return "unknown"


def _settings(name: str, kind: str, uri: str, warehouse: Any, home: Path, *, embedded: bool) -> dict[str, Any]:
    return {
        "name": name,
        "type": kind,
        "uri": mask_password(uri),
        "warehouse": None if warehouse is None else str(warehouse),
        "icelog_home": str(home),
        "embedded": embedded,
    }


SECRET_KEYS = ("password", "secret", "token", "credential")  # pyiceberg property names that hold secrets


def pyiceberg_properties(name: str | None, settings: Settings, doc: dict[str, Any]) -> dict[str, str]:
    """The catalog's pyiceberg properties, secrets masked: what to paste into ``.pyiceberg.yaml``."""
    from pyiceberg.utils.config import Config

    conf = {} if doc["embedded"] else dict(Config().get_catalog_config(doc["name"]) or {})
    props = {"type": doc["type"], "uri": doc["uri"], **({"warehouse": doc["warehouse"]} if doc["warehouse"] else {})}
    for key, value in sorted(conf.items()):
        if key not in props:
            props[key] = SECRET if any(word in key.lower() for word in SECRET_KEYS) else str(value)
    return props


@click.command("catalog")
@click.option(
    "--format",
    "shape",
    type=click.Choice(["summary", "yaml", "env"]),
    default="summary",
    show_default=True,
    help="Text output: a summary, or the pyiceberg configuration to paste (.pyiceberg.yaml, or PYICEBERG_CATALOG__ lines).",
)
@click.pass_obj
def catalog(ctx: Context, shape: str) -> None:
    """The catalog in use (name, type, uri with its password masked, warehouse, ICELOG_HOME); opens nothing.

    ``--format yaml`` or ``env`` prints its pyiceberg configuration, for pyiceberg, Spark or DuckDB
    users to reach the same catalog (secrets masked as ****: fill them in)."""
    doc = catalog_settings(ctx.catalog_name, ctx.settings)
    doc["pyiceberg"] = pyiceberg_properties(ctx.catalog_name, ctx.settings, doc)

    def text(d: dict[str, Any]) -> None:
        props = d["pyiceberg"]
        if shape == "yaml":
            click.echo(
                "catalog:\n" + f"  {d['name']}:\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in props.items()), nl=False
            )
        elif shape == "env":
            prefix = f"PYICEBERG_CATALOG__{d['name'].upper()}__"
            click.echo(
                "".join(f"{prefix}{k.upper().replace('.', '__').replace('-', '_')}={shlex.quote(v)}\n" for k, v in props.items()),
                nl=False,
            )
        else:
            for key in ("name", "type", "uri", "warehouse", "icelog_home", "exists"):
                if key in d:
                    click.echo(f"{key:<12} {d[key] if d[key] is not None else ''}")

    ctx.emit(doc, text)
