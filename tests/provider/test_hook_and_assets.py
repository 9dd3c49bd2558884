"""The provider's registration, the ``icelog`` connection, ``IcelogHook`` and Asset URIs."""

from __future__ import annotations

import json
import os
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from airflow.sdk import Connection

from icelog.provider import get_provider_info
from icelog.provider.assets import asset_uri, icelog_asset, sanitize_uri
from icelog.provider.hooks import IcelogHook, catalog_properties
from icelog.storage.errors import InvalidConnection, UnknownTable
from icelog.storage.log.table import LogTable
from infra.airflow import BIN


def test_provider_info_is_valid_for_airflow():
    import jsonschema

    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "icelog"
    (conn,) = info["connection-types"]
    assert (conn["connection-type"], conn["hook-class-name"]) == ("icelog", "icelog.provider.hooks.IcelogHook")
    (uris,) = info["asset-uris"]
    assert (uris["schemes"], uris["handler"]) == (["icelog"], "icelog.provider.assets.sanitize_uri")
    assert uris["to_openlineage_converter"] == "icelog.provider.lineage.convert_asset_to_openlineage"


def test_airflow_lists_icelog_among_its_providers_and_hooks(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    listed = subprocess.run(
        [str(BIN / "airflow"), "providers", "list", "--output", "json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    providers = {p["package_name"]: p for p in json.loads(listed.stdout[listed.stdout.index("[") :])}
    assert "icelog" in providers, sorted(providers)
    hooks = subprocess.run(
        [str(BIN / "airflow"), "providers", "hooks", "--output", "json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert hooks.returncode == 0, hooks.stderr[-2000:]
    found = [h for h in json.loads(hooks.stdout[hooks.stdout.index("[") :]) if h["connection_type"] == "icelog"]
    assert [(h["class"], h["conn_id_attribute_name"]) for h in found] == [("icelog.provider.hooks.IcelogHook", "icelog_conn_id")]


def test_hook_follows_airflows_hook_conventions():
    assert IcelogHook.conn_name_attr == "icelog_conn_id"
    assert IcelogHook.default_conn_name == "icelog_default"
    assert IcelogHook.conn_type == "icelog"
    assert IcelogHook.hook_name


def test_a_sql_connection_in_uri_form_builds_the_database_uri_with_its_credentials():
    conn = Connection.from_uri(
        "icelog://cat%40user:p%2Fss@db.example:5432/catalog?catalog_type=sql&warehouse=s3%3A%2F%2Flake%2Fwh"
        "&s3_endpoint=http%3A%2F%2F127.0.0.1%3A8333&s3_region=us-east-1&s3_access_key_id=AK&s3_secret_access_key=SK",
        conn_id="lake",
    )
    name, props = catalog_properties(conn)
    assert name == "lake"
    assert props == {
        "type": "sql",
        "uri": "postgresql+psycopg2://cat%40user:p%2Fss@db.example:5432/catalog",
        "warehouse": "s3://lake/wh",
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.region": "us-east-1",
        "s3.access-key-id": "AK",
        "s3.secret-access-key": "SK",
    }


def test_a_rest_connection_in_json_form_passes_credentials_and_properties():
    extra = {
        "catalog_type": "rest",
        "uri": "http://127.0.0.1:8181",
        "warehouse": "lake",
        "properties": {"rest.sigv4-enabled": "true"},
    }
    conn = Connection(conn_id="rest_lake", conn_type="icelog", login="client", password="secret", extra=json.dumps(extra))
    assert catalog_properties(conn) == (
        "rest_lake",
        {
            "type": "rest",
            "uri": "http://127.0.0.1:8181",
            "credential": "client:secret",
            "warehouse": "lake",
            "rest.sigv4-enabled": "true",
        },
    )
    token = Connection(
        conn_id="t",
        conn_type="icelog",
        host="cat.example",
        port=443,
        password="tok",
        extra='{"catalog_type": "rest", "scheme": "https"}',
    )
    assert catalog_properties(token)[1] == {"type": "rest", "uri": "https://cat.example:443", "token": "tok"}
    # The UI's form keeps its fields as extra__icelog__<name>.
    form = Connection(
        conn_id="f",
        conn_type="icelog",
        extra='{"extra__icelog__uri": "sqlite:////x/catalog.db", "extra__icelog__catalog_name": "x"}',
    )
    assert catalog_properties(form) == ("x", {"type": "sql", "uri": "sqlite:////x/catalog.db"})


@pytest.mark.parametrize(
    ("conn", "says"),
    [
        (
            Connection(conn_id="pg", conn_type="postgres", host="db"),
            "Airflow connection 'pg': it is of type 'postgres', not 'icelog'",
        ),
        (
            Connection(conn_id="odd", conn_type="icelog", host="h", extra='{"catalog_type": "hive"}'),
            "catalog_type 'hive' is not one of sql, rest",
        ),
        (Connection(conn_id="bare", conn_type="icelog"), "no catalog URI"),
        (
            Connection(conn_id="props", conn_type="icelog", host="h", extra='{"properties": [1]}'),
            "extra 'properties' must be an object",
        ),
    ],
)
def test_a_connection_that_cannot_open_a_catalog_is_refused_by_name(conn, says):
    with pytest.raises(InvalidConnection, match=says):
        catalog_properties(conn)


def test_the_hook_opens_the_catalog_of_a_connection_from_the_environment(lake, monkeypatch, tmp_path):
    catalog, spec = lake
    LogTable.create(catalog, "demo.events", 2).append({1: [{"key": "k", "value": "v"}]})
    for key in [k for k in os.environ if k.startswith(("ICELOG_", "PYICEBERG_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "no-home"))
    extra = {"uri": spec["uri"], "warehouse": spec["warehouse"], "catalog_name": "lake"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "icelog", "extra": extra}))
    hook = IcelogHook("lake")
    assert hook.get_log_table("demo.events").watermarks()[1].end == 1
    assert hook.catalog_name == "lake"
    assert hook.test_connection()[0] is True
    with pytest.raises(UnknownTable, match="demo.nope"):
        hook.get_log_table("demo.nope")
    with pytest.raises(InvalidConnection, match="Airflow connection 'nope': not defined .*AIRFLOW_CONN_NOPE"):
        IcelogHook("nope").get_conn()
    assert not (tmp_path / "no-home").exists()  # icelog's embedded default was never opened


def test_assets_name_the_catalog_namespace_and_table(monkeypatch):
    monkeypatch.delenv("ICELOG_CATALOG", raising=False)
    asset = icelog_asset("demo.flights", "lake")
    assert (asset.name, asset.uri, asset.group) == ("icelog://lake/demo/flights", "icelog://lake/demo/flights", "icelog")
    assert asset_uri("demo.flights") == "icelog://icelog/demo/flights"  # the embedded catalog
    monkeypatch.setenv("ICELOG_CATALOG", "prod")
    assert asset_uri("events") == "icelog://prod/logs/events"  # a bare name is in namespace logs
    with pytest.raises(ValueError, match="not a name"):
        asset_uri("demo.bad/name", "lake")
    from urllib.parse import urlsplit

    assert sanitize_uri(urlsplit("icelog://lake/demo/flights")).geturl() == "icelog://lake/demo/flights"
    for bad in ("icelog://lake/flights", "icelog://lake/a/b/c", "icelog:///demo/flights"):
        with pytest.raises(ValueError, match="icelog://<catalog>/<namespace>/<table>"):
            sanitize_uri(urlsplit(bad))


def test_airflow_checks_icelog_asset_uris_through_the_provider(tmp_path):
    code = (
        "from airflow.sdk import Asset\n"
        "print(Asset(uri='icelog://lake/demo/flights').uri)\n"
        "try:\n    Asset(uri='icelog://lake/flights')\nexcept ValueError as e:\n    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {"AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "python"), "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "icelog://lake/demo/flights" in done.stdout
    assert "refused: an icelog Asset URI is icelog://<catalog>/<namespace>/<table>" in done.stdout, done.stdout


def test_openlineage_translates_icelog_assets_through_the_providers_converter(tmp_path):
    """The OpenLineage provider finds the converter through ``airflow providers`` (a new process:
    the providers manager caches what it discovered)."""
    code = (
        "from airflow.sdk import Asset\n"
        "from airflow.providers.openlineage.utils.utils import translate_airflow_asset\n"
        "d = translate_airflow_asset(Asset(uri='icelog://lake/demo/flights'), None)\n"
        "print('dataset', d.namespace, d.name)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {"AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "python"), "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dataset icelog://lake demo.flights" in done.stdout, done.stdout + done.stderr[-2000:]


def test_lineage_names_tables_like_their_assets_and_files_by_their_file_system():
    from icelog.provider.lineage import path_names, table_names

    assert table_names("lake", "demo.flights") == ("icelog://lake", "demo.flights")
    assert table_names("lake", "flights") == ("icelog://lake", "logs.flights")
    assert path_names("/data/landing/x.parquet") == ("file", "/data/landing/x.parquet")
    assert path_names("file:///data/x.parquet") == ("file", "/data/x.parquet")
    assert path_names("s3://bucket/landing/x.parquet") == ("s3://bucket", "landing/x.parquet")
