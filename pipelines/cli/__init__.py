"""The ``icelog`` command line: a package whose imports point one way.

:mod:`pipelines.cli.app` holds the Click group ``cli``, the global options, the output
helpers and the exit codes. Each module beside it holds one family of commands as plain
Click commands and groups; it imports ``app`` (and the storage, validations and pipelines
modules below the command line), never another command module. This file adds every command
to the group: the list below is the whole command line.

Start-up: at module level the command modules import only click, the standard library,
``app`` and ``storage.errors``. storage's tables, pyiceberg, pyarrow, DuckDB, Spark, Great
Expectations and rich load inside the command that uses them, so ``icelog --help`` imports
none of them and ``icelog offsets T`` only what reading watermarks needs.
"""

from icelog.pipelines.cli import (
    group_job,
    groups,
    ingest,
    maintenance,
    mirror,
    produce,
    producers,
    query,
    serve,
    topics,
    transactions,
    validate,
    views,
)
from icelog.pipelines.cli.app import cli, exit_code, main

__all__ = ["cli", "exit_code", "main"]

cli.add_command(topics.topics)  # icelog topics create|list|describe|alter|add-partitions|delete
cli.add_command(topics.offsets)  # icelog offsets
cli.add_command(produce.produce)  # icelog produce
cli.add_command(producers.producers)  # icelog producers init|list|rebuild
cli.add_command(transactions.transactions)  # icelog transactions list|describe|recover|abort
cli.add_command(groups.consume)  # icelog consume
cli.add_command(groups.groups)  # icelog groups list|describe|commit|reset
cli.add_command(group_job.consume_produce)  # icelog consume-produce
cli.add_command(ingest.ingest)  # icelog ingest
cli.add_command(query.sql)  # icelog sql
cli.add_command(query.duckdb_shell)  # icelog duckdb
cli.add_command(views.snapshots)  # icelog snapshots
cli.add_command(views.files)  # icelog files
cli.add_command(views.schema)  # icelog schema
cli.add_command(views.catalog)  # icelog catalog
cli.add_command(validate.validate)  # icelog validate
cli.add_command(validate.report)  # icelog report
cli.add_command(maintenance.maintain)  # icelog maintain
cli.add_command(maintenance.repair)  # icelog repair
cli.add_command(mirror.mirror)  # icelog mirror [run|promote]
cli.add_command(mirror.acls)  # icelog acls add|remove|list
cli.add_command(serve.serve)  # icelog serve
