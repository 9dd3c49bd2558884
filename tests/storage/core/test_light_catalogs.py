"""The light reads' pieces: the standard-library SigV4 signature is botocore's, and a REST catalog
configured with anything the light read does not honour is left to pyiceberg."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from icelog.storage.core.rest_pointer import RestReader
from icelog.storage.core.signed_get import EMPTY_SHA256, Signer

AT = dt.datetime(2026, 11, 28, 4, 5, 6, tzinfo=dt.UTC)


@pytest.mark.parametrize("service", ["s3", "s3tables", "execute-api"])
@pytest.mark.parametrize("token", [None, "session-token"])
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8333/bucket/wh/db/t/metadata/00001-abc.metadata.json",
        "http://127.0.0.1:8181/v1/arn%3Aaws%3As3tables%3Aus-east-1%3A0%3Abucket%2Fw/namespaces/logs/tables/events",
        "http://127.0.0.1:8181/v1/config?warehouse=s3%3A%2F%2Fw&b=2&a=1",
    ],
)
def test_the_signature_is_botocores(service, token, url, monkeypatch):
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda *a, **k: AT.replace(tzinfo=None))
    signer = Signer("AKID", "SECRET", "us-east-1", service, token)
    mine = signer.headers(url, now=AT)
    request = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": EMPTY_SHA256})
    auth = S3SigV4Auth if service == "s3" else SigV4Auth  # S3 signs the path as sent, the others encode it again
    auth(Credentials("AKID", "SECRET", token), service, "us-east-1").add_auth(request)
    assert mine["Authorization"] == request.headers["Authorization"]
    assert mine["x-amz-date"] == request.headers["X-Amz-Date"]


SIGNED = {
    "type": "rest",
    "uri": "http://127.0.0.1:1",
    "rest.sigv4-enabled": "true",
    "client.access-key-id": "k",
    "client.secret-access-key": "s",
    "header.X-Custom": "v",
    "s3.endpoint": "http://127.0.0.1:2",
}


@pytest.mark.parametrize(
    "change, applies",
    [
        ({}, True),
        ({"token": "t"}, True),
        ({"credential": "id:secret"}, False),  # OAuth2 client credentials: pyiceberg fetches a token
        ({"auth": "{}"}, False),
        ({"ssl": "{}"}, False),
        ({"client.profile-name": "p"}, False),
        ({"snapshot-loading-mode": "refs"}, False),
        ({"client.access-key-id": ""}, False),  # SigV4 from the environment's credential chain
        ({"type": "sql"}, False),
    ],
)
def test_a_rest_catalog_is_read_lightly_only_with_properties_it_honours(change, applies):
    assert RestReader.applies({**SIGNED, **change}) is applies
