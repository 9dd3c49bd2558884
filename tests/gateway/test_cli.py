"""``icelog serve`` on the command line: loopback only until it authenticates clients."""

from __future__ import annotations

import pytest

from icelog.pipelines.cli.serve import check_loopback
from icelog.storage.errors import UnsafeListener
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
