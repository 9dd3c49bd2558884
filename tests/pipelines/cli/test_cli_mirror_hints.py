"""``icelog mirror``'s errors name the option that fixes them: a mirror names two catalogs
(``--catalog`` for the source or the mirror, ``--target-catalog`` for the copy), and an error
alone does not say which one was meant."""

from __future__ import annotations

import pytest

from icelog.storage.log.table import LogTable
from tests.support.cli import Cli


@pytest.fixture
def icelog(sqlite_spec, mirror_cli) -> Cli:
    LogTable.create(sqlite_spec.open(), "orders", 1).append({0: [{"key": "a"}]})
    return mirror_cli


def error(icelog: Cli, *args: str, code: int) -> tuple[str, str]:
    """(the JSON document's error type and message, the text mode's stderr line)."""
    doc = icelog(*args, code=code)
    text = icelog.raw(*args, json_output=False)
    assert text.exit_code == code
    assert text.stderr.startswith(f"error: {doc['error']}: ") and doc["message"] in text.stderr
    return doc["error"], doc["message"]


def test_an_unknown_catalog_names_its_option(icelog):
    kind, message = error(icelog, "mirror", "orders", "--target-catalog", "nowhere", code=2)
    assert kind == "CatalogNotConfigured" and "'nowhere' is not configured" in message
    assert message.endswith("it is the catalog of the copy, named by --target-catalog")
    kind, message = error(icelog, "--catalog", "nowhere", "mirror", "orders", "--target-catalog", "drcat", code=2)
    assert message.endswith("it is the catalog orders is read from, named by --catalog (or $ICELOG_CATALOG)")
    kind, message = error(icelog, "--catalog", "nowhere", "mirror", "promote", "orders", code=2)
    assert message.endswith("it is the mirror's catalog, named by --catalog (or $ICELOG_CATALOG)")


def test_a_missing_permission_says_what_to_pass_or_grant_and_where(icelog):
    kind, message = error(icelog, "mirror", "orders", "--target-catalog", "drcat", code=5)
    assert kind == "AuthorizationFailed" and message.endswith(
        "name the mirror's principal with --principal P (or $ICELOG_PRINCIPAL)"
    )
    kind, message = error(icelog, "mirror", "orders", "--target-catalog", "drcat", "--principal", "bot", code=5)
    hint = "grant it in the target catalog: icelog --catalog drcat acls add --principal bot --table logs.orders"
    assert kind == "AuthorizationFailed" and message.endswith(hint)
    # The hint is the command that fixes it: run as given, the step then goes through.
    icelog(*hint.split(": ", 1)[1].split()[1:])
    assert icelog("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot")["log_ends"] == {"0": 1}


def test_a_table_in_another_catalog_names_catalog_options(icelog):
    icelog("--catalog", "drcat", "acls", "add", "--principal", "bot", "--table", "*")
    kind, message = error(icelog, "mirror", "elsewhere", "--target-catalog", "drcat", "--principal", "bot", code=2)
    assert kind == "UnknownTable" and message.endswith("pass --catalog NAME for the catalog elsewhere is in")
    icelog("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot")
    # promote on the source's catalog: the mirror is in drcat
    kind, message = error(icelog, "mirror", "promote", "orders", code=2)
    assert kind == "InvalidInput" and "is not a mirror target" in message
    assert "promote runs in the mirror's own catalog, not 'testcat': icelog --catalog NAME mirror promote orders" in message
    assert icelog("--catalog", "drcat", "mirror", "promote", "orders")["promoted"] is True
    kind, message = error(icelog, "mirror", "orders", "--target-catalog", "drcat", "--principal", "bot", code=2)
    assert kind == "MirrorPromoted" and message.endswith("mirror into another --target-table or --target-catalog")


def test_a_mirror_onto_itself_names_target_catalog(icelog):
    kind, message = error(icelog, "mirror", "orders", "--target-catalog", "testcat", "--principal", "bot", code=2)
    assert kind == "InvalidInput" and "cannot mirror itself" in message
    assert message.endswith("--target-catalog names the source's catalog 'testcat' (--catalog): name another")


def test_mirror_parity_on_a_table_that_is_no_mirror_names_the_catalog_option(icelog):
    found = icelog("validate", "orders", "--check", "mirror-parity", code=1)
    (violation,) = found["violations"]
    assert violation["kind"] == "not_a_mirror" and "in its catalog (--catalog NAME)" in violation["detail"]


def test_mirror_parity_when_the_recorded_source_catalog_is_not_configured_here(icelog, target_spec, sqlite_spec, monkeypatch):
    from icelog.storage.core.catalog import CatalogNotConfigured
    from icelog.storage.core.commit import load
    from icelog.validations.mirror import check_mirror_parity

    icelog("--catalog", "drcat", "acls", "add", "--principal", "bot", "--table", "*")
    icelog("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot")
    for key in sqlite_spec.env():
        monkeypatch.delenv(key, raising=False)  # here, only the copy's catalog is known
    with pytest.raises(CatalogNotConfigured) as refused:
        check_mirror_parity(load(target_spec.open(), "logs.orders"))
    assert str(refused.value).startswith(f"catalog {sqlite_spec.name!r} is not configured")
    assert str(refused.value).endswith(
        "it is the source of mirror logs.orders, recorded in its icelog.mirror: configure that catalog here by that name"
    )
