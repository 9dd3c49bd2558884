"""``icelog serve`` on the command line: loopback only unless it authenticates clients."""

from __future__ import annotations

import socket

import pytest

from icelog.pipelines.cli.serve import advertised, check_listener, check_loopback
from icelog.pipelines.gateway.sasl import load_users
from icelog.storage.errors import SaslUsersFile, UnsafeListener
from tests.support.cli import Cli


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_listening_beyond_loopback_is_refused_before_binding(sqlite_spec, host):
    doc = Cli(sqlite_spec)("serve", "--host", host, "--port", "0", code=2)
    assert doc["error"] == "UnsafeListener" and doc["host"] == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts_are_accepted(host):
    check_loopback(host)


def test_a_name_that_does_not_resolve_is_refused():
    with pytest.raises(UnsafeListener):
        check_loopback("no-such-host.invalid")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_any_address_is_accepted_with_sasl_users(host):
    check_listener(host, authenticated=True)
    with pytest.raises(UnsafeListener):
        check_listener(host, authenticated=False)


def test_a_wildcard_bind_advertises_this_machines_name():
    assert advertised("0.0.0.0", None) == socket.getfqdn()
    assert advertised("127.0.0.1", None) == "127.0.0.1"
    assert advertised("0.0.0.0", "gw.example") == "gw.example"


@pytest.mark.parametrize(
    ("text", "mode", "says"),
    [
        ("alice:pw\n", 0o644, "group or others"),
        ("alice\n", 0o600, "line 1 is not user:password"),
        ("# c\nalice:\n", 0o600, "line 2 is not user:password"),
        ("alice:a\nalice:b\n", 0o600, "line 2 repeats a user"),
        ("# nobody\n", 0o600, "names no user"),
    ],
)
def test_a_bad_users_file_is_refused_before_serving_and_its_secrets_are_not_shown(sqlite_spec, tmp_path, text, mode, says):
    path = tmp_path / "users"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(SaslUsersFile, match=says):
        load_users(path)
    doc = Cli(sqlite_spec)("serve", "--port", "0", "--sasl-users", str(path), code=2)
    assert doc["error"] == "SaslUsersFile" and says in doc["message"] and "pw" not in doc["message"]


def test_a_missing_users_file_is_refused(tmp_path):
    with pytest.raises(SaslUsersFile, match="cannot read"):
        load_users(tmp_path / "nothing")
