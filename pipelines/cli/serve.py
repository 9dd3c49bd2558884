"""``icelog serve``: the Kafka-protocol gateway onto the catalog's log tables (``pipelines.gateway``)."""

from __future__ import annotations

import ipaddress
import socket

import click

from icelog.pipelines.cli.app import Context
from icelog.storage.errors import UnsafeListener

WILDCARDS = {"0.0.0.0", "::", ""}


def check_listener(host: str, authenticated: bool) -> None:
    """Any address with SASL users; loopback addresses only without (:class:`UnsafeListener`)."""
    if not authenticated:
        check_loopback(host)


def advertised(host: str, advertised_host: str | None) -> str:
    """The address clients are told to connect to: a wildcard bind advertises this machine's name."""
    if advertised_host:
        return advertised_host
    return socket.getfqdn() if host in WILDCARDS else host


def check_loopback(host: str) -> None:
    """Raise :class:`UnsafeListener` unless every address ``host`` names is a loopback address."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as e:
        raise UnsafeListener(host=host) from e
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise UnsafeListener(host=host)


@click.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (beyond loopback only with --sasl-users)."
)
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True, help="Port; 0 picks a free one.")
@click.option(
    "--linger-ms",
    type=click.FloatRange(0, 10_000),
    default=5.0,
    show_default=True,
    help="How long a table's batches wait to share one commit.",
)
@click.option(
    "--sasl-users",
    "sasl_users",
    type=click.Path(dir_okay=False),
    help="A file of user:password lines (mode 600); clients must then authenticate (SASL PLAIN, SCRAM-SHA-256/512). "
    "Default: ICELOG_SERVE_SASL_USERS.",
)
@click.option(
    "--advertised-host", help="The host clients are told to connect to (default: --host; a wildcard: this machine's name)."
)
@click.pass_obj
def serve(ctx: Context, host: str, port: int, linger_ms: float, sasl_users: str | None, advertised_host: str | None) -> None:
    """Serve the catalog's log tables to Kafka clients until SIGTERM or Ctrl-C.

    Prints the bootstrap address (with --output json one JSON line: {"bootstrap", "host", "port"}).
    A topic NS.TABLE is the log table NS.TABLE (a bare name is in namespace logs); Kafka
    partitions are log partitions. With --sasl-users (or ICELOG_SERVE_SASL_USERS) every client
    authenticates first, and --host may be any address. On SIGTERM every acknowledged record is committed already;
    batches still waiting are committed and answered before the process exits.
    """
    import asyncio
    import signal

    from icelog.storage.extras import require

    require("kio", "icelog serve")
    require("cramjam", "icelog serve")
    from icelog.pipelines.gateway.sasl import load_users
    from icelog.pipelines.gateway.server import Gateway

    sasl_users = sasl_users or ctx.settings.serve_sasl_users
    users = load_users(sasl_users) if sasl_users else None
    check_listener(host, users is not None)
    catalog = ctx.catalog

    async def run() -> None:
        gateway = Gateway(catalog, host, port, linger_ms, users=users, advertised_host=advertised(host, advertised_host))
        await gateway.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        shown = gateway.advertised_host
        bootstrap = f"{shown}:{gateway.port}" if ":" not in shown else f"[{shown}]:{gateway.port}"
        ctx.emit(
            {"bootstrap": bootstrap, "host": host, "port": gateway.port},
            lambda d: click.echo(f"icelog serve: bootstrap.servers={d['bootstrap']} (catalog {catalog.name})"),
        )
        click.get_text_stream("stdout").flush()
        await stop.wait()
        await gateway.stop()

    asyncio.run(run())
