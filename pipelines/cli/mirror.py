"""``icelog mirror`` and ``icelog acls``: offset-preserving replication and its permission."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import click

from icelog.pipelines.cli.app import Context, echo_list, plural, status_line
from icelog.storage.errors import AuthorizationFailed, IcelogError, InvalidInput, MirrorPromoted, NotALogTable, UnknownTable, span


@contextlib.contextmanager
def _hint(hint_for: Callable[[IcelogError], str | None]) -> Iterator[None]:
    """Add to an icelog error's message the option that fixes it: a mirror names two
    catalogs, and the error alone does not say which one was meant."""
    try:
        yield
    except IcelogError as e:
        from icelog.validations.mirror import with_hint

        hint = hint_for(e)
        if hint:
            with_hint(e, hint)
        raise


def _catalog_hint(option: str, what: str) -> Callable[[IcelogError], str | None]:
    from icelog.storage.core.catalog import CatalogNotConfigured

    def hint(e: IcelogError) -> str | None:
        if isinstance(e, CatalogNotConfigured):
            return f"it is {what}, named by {option}"
        return None

    return hint


class _MirrorGroup(click.Group):
    """``icelog mirror SOURCE ...`` runs a mirror step; ``icelog mirror promote TABLE`` promotes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_MirrorGroup)
def mirror() -> None:
    """Mirror a log table to another catalog with the same offsets (KIP-391).

    \b
    icelog mirror SOURCE --target-catalog NAME [--target-table T] [--principal P]
    icelog mirror promote TABLE      (on the target catalog: --catalog NAME)
    """


@mirror.command("run")
@click.argument("source")
@click.option("--target-catalog", required=True, help="pyiceberg catalog name of the copy.")
@click.option("--target-table", default=None, help="Name of the copy (default: the source's).")
@click.option(
    "--principal",
    default=None,
    help="Who writes (needs replicator-write on the target; default $ICELOG_PRINCIPAL).",
)
@click.pass_obj
def mirror_run(ctx: Context, source: str, target_catalog: str, target_table: str | None, principal: str | None) -> None:
    """Copy what SOURCE (in --catalog) committed since the last step; resumable."""
    from icelog.storage.core.catalog import open_catalog
    from icelog.storage.replication.mirror import mirror as run

    principal = principal or ctx.settings.principal

    with _hint(_catalog_hint("--catalog (or $ICELOG_CATALOG)", f"the catalog {source} is read from")):
        source_catalog = ctx.catalog
    with _hint(_catalog_hint("--target-catalog", "the catalog of the copy")):
        copy_catalog = open_catalog(target_catalog, settings=ctx.settings)

    def hint(e: IcelogError) -> str | None:
        if isinstance(e, AuthorizationFailed):
            if not (principal or "").strip():
                return "name the mirror's principal with --principal P (or $ICELOG_PRINCIPAL)"
            return (
                f"grant it in the target catalog: icelog --catalog {copy_catalog.name} acls add "
                f"--principal {principal} --table {e.table}"
            )
        if isinstance(e, (UnknownTable, NotALogTable)) and e.table in (source, _qualified(source)):
            return f"the source is read from --catalog (or $ICELOG_CATALOG): pass --catalog NAME for the catalog {source} is in"
        if isinstance(e, MirrorPromoted):
            return "mirror into another --target-table or --target-catalog"
        itself = source_catalog.name == copy_catalog.name and _qualified(target_table or source) == _qualified(source)
        if type(e) is InvalidInput and itself:
            return f"--target-catalog names the source's catalog {source_catalog.name!r} (--catalog): name another"
        return None

    with _hint(hint), status_line(ctx, f"mirroring {source} -> {copy_catalog.name}/{target_table or source}"):
        result = run(
            source_catalog, source, copy_catalog, target_table, principal=principal, copy_threads=ctx.settings.mirror_threads
        )

    def text(d: dict) -> None:
        if d["up_to_date"]:
            click.echo(f"{d['target']} in {d['target_catalog']} is up to date with {d['source']}")
            return
        added = (
            ", ".join(f"p{p}: {span(r[0], r[1])}" for p, r in sorted(d["ranges"].items(), key=lambda e: int(e[0])))
            or "no new offsets"
        )
        click.echo(
            f"mirrored {d['source']} -> {d['target_catalog']}/{d['target']}: {added} ({plural(d['copied_files'], 'file')} copied, {d['seconds']:.2f} s)"
        )

    ctx.emit(result.to_dict(), text)


@mirror.command("promote")
@click.argument("table")
@click.pass_obj
def mirror_promote(ctx: Context, table: str) -> None:
    """Make the mirror target TABLE (in --catalog) writable; mirroring into it stops."""
    from icelog.storage.replication.mirror import promote

    with _hint(_catalog_hint("--catalog (or $ICELOG_CATALOG)", "the mirror's catalog")):
        catalog = ctx.catalog

    def hint(e: IcelogError) -> str | None:
        if isinstance(e, (UnknownTable, NotALogTable)) or type(e) is InvalidInput:
            return f"promote runs in the mirror's own catalog, not {catalog.name!r}: icelog --catalog NAME mirror promote {table}"
        return None

    with _hint(hint):
        result = promote(catalog, table)
    ctx.emit(result, lambda d: click.echo(f"{d['table']} is promoted: writable, no longer mirrored"))


def _qualified(table: str) -> str:
    from icelog.storage.log.schema import qualified

    try:
        return qualified(table)
    except IcelogError:
        return table


@click.group()
def acls() -> None:
    """Permissions (default deny), stored in the catalog's icelog_system.acls."""


def _acl_options(f):
    f = click.option(
        "--operation",
        type=click.Choice(["replicator-write"]),
        default="replicator-write",
        show_default=True,
        help="The permission: replicator-write lets a mirror write explicit offsets.",
    )(f)
    f = click.option("--table", "pattern", required=True, help="Table name or fnmatch pattern, e.g. 'logs.*'.")(f)
    return click.option("--principal", required=True, help="Who the grant is for (the mirror's $ICELOG_PRINCIPAL).")(f)


@acls.command("add")
@_acl_options
@click.pass_obj
def acls_add(ctx: Context, principal: str, pattern: str, operation: str) -> None:
    """Grant OPERATION on tables matching --table to --principal."""
    from icelog.storage.replication.acls import add_acl

    ctx.emit(
        add_acl(ctx.catalog, principal, pattern, operation),
        lambda d: click.echo(f"granted {operation} on {pattern} to {principal}"),
    )


@acls.command("remove")
@_acl_options
@click.pass_obj
def acls_remove(ctx: Context, principal: str, pattern: str, operation: str) -> None:
    """Revoke exactly that grant."""
    from icelog.storage.replication.acls import remove_acl

    ctx.emit(
        remove_acl(ctx.catalog, principal, pattern, operation),
        lambda d: click.echo(f"revoked {operation} on {pattern} from {principal}"),
    )


@acls.command("list")
@click.pass_obj
def acls_list(ctx: Context) -> None:
    """Every grant."""
    from icelog.storage.replication.acls import list_acls

    grants = [a.to_dict() for a in list_acls(ctx.catalog)]

    def text(d: dict) -> None:
        echo_list((f"{a['principal']}\t{a['operation']}\t{a['table']}" for a in d["acls"]), "grants (default deny)")

    ctx.emit({"acls": grants}, text)
