"""An HTTP GET with the standard library, signed with AWS Signature Version 4 when asked.

The light reads of :mod:`icelog.storage.core.pointer` fetch a REST catalog's answer and a
metadata file on S3 with it: ``requests``, botocore and pyarrow's S3 filesystem each cost more to
import than the whole read. Signing follows the published algorithm as botocore applies it
(``tests/storage/core/test_light_catalogs.py`` holds it to botocore's ``SigV4Auth`` and ``S3SigV4Auth``): the path
encoded again for services other than S3, the query sorted, and ``host``, ``x-amz-date``,
``x-amz-content-sha256`` (and ``x-amz-security-token``) signed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import urllib.request
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import parse_qsl, quote, urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
TIMEOUT_S = 10


@dataclass(frozen=True)
class Signer:
    """The credentials and scope one service's requests are signed with."""

    access_key: str
    secret_key: str
    region: str
    service: str
    session_token: str | None = None

    def headers(self, url: str, now: dt.datetime | None = None) -> dict[str, str]:
        """The headers that sign a GET of ``url`` with no body."""
        now = now or dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        parts = urlsplit(url)
        headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date}
        if self.session_token:
            headers["x-amz-security-token"] = self.session_token
        path = parts.path or "/"
        if self.service != "s3":  # botocore encodes the (already encoded) path once more, except for S3
            path = quote(path, safe="/~")
        query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(parse_qsl(parts.query, keep_blank_values=True))
        )
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            ["GET", path, query, "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)), signed, EMPTY_SHA256]
        )
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = f"AWS4{self.secret_key}".encode()
        for part in (day, self.region, self.service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
        )
        del headers["host"]  # urllib sends it, as signed
        return headers


def get(url: str, headers: Mapping[str, str] = {}, signer: Signer | None = None) -> bytes:
    """The body of a GET of ``url``.

    Raises:
        OSError: no connection, a timeout, or an answer other than 2xx (``urllib.error.HTTPError``).
    """
    all_headers = {**headers, **(signer.headers(url) if signer else {})}
    with urllib.request.urlopen(urllib.request.Request(url, headers=all_headers), timeout=TIMEOUT_S) as response:
        return response.read()
