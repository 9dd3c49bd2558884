"""A table's current metadata and the catalog's table names from a REST catalog, with the
standard library: the requests pyiceberg's ``RestCatalog`` makes for them, without importing it.

pyiceberg first asks ``GET /v1/config`` (its ``defaults`` under the configuration, its
``overrides`` over it, which may move ``uri`` and add a ``prefix``), then ``GET
/v1/{prefix}/namespaces/{ns}/tables/{t}``, whose answer holds the metadata itself. The same
headers go with them: ``header.*`` properties, a bearer ``token``, and a SigV4 signature when
``rest.sigv4-enabled`` (credentials from the ``client.*`` keys). A catalog configured with
anything else that changes a request (OAuth2 ``credential``, ``auth``, ``ssl``, a profile or a
role, a snapshot loading mode) answers None here: the full read honours it.
"""

from __future__ import annotations

import json
from typing import Any, Mapping
from urllib.parse import quote, urlencode

from icelog.storage.core.signed_get import Signer, get

# Properties that do not change these requests, or that this module applies itself.
UNDERSTOOD = {
    "type",
    "uri",
    "warehouse",
    "token",
    "py-io-impl",
    "rest.sigv4-enabled",
    "rest.signing-name",
    "rest.signing-region",
    "rest.sigv4.max-retries",
    "client.access-key-id",
    "client.secret-access-key",
    "client.session-token",
    "client.region",
    "namespace-separator",
}
UNDERSTOOD_PREFIXES = ("header.", "s3.", "gcs.", "adls.", "hf.", "pyarrow.")  # headers, and the FileIO's own keys
ACCESS_DELEGATION = "vended-credentials"  # pyiceberg's default X-Iceberg-Access-Delegation


class RestReader:
    """Reads of one REST catalog as pyiceberg makes them (after its ``/v1/config``)."""

    def __init__(self, properties: Mapping[str, Any]) -> None:
        self.properties = {k: str(v) for k, v in properties.items()}
        self.headers = {
            "Content-type": "application/json",
            "X-Iceberg-Access-Delegation": ACCESS_DELEGATION,
            **{k[len("header.") :]: v for k, v in self.properties.items() if k.startswith("header.")},
        }
        if self.properties.get("token"):
            self.headers["Authorization"] = f"Bearer {self.properties['token']}"
        self.signer: Signer | None = None
        if self.properties.get("rest.sigv4-enabled", "").lower() == "true":
            region = self.properties.get("rest.signing-region") or self.properties.get("client.region", "")
            self.signer = Signer(
                self.properties["client.access-key-id"],
                self.properties["client.secret-access-key"],
                region,
                self.properties.get("rest.signing-name", "execute-api"),
                self.properties.get("client.session-token") or None,
            )
        self.uri, self.prefix = self.properties["uri"], ""
        params = {"warehouse": self.properties["warehouse"]} if self.properties.get("warehouse") else {}
        config = self._get(self._url("config", prefixed=False), params)
        merged = {**config.get("defaults", {}), **self.properties, **config.get("overrides", {})}
        self.uri, self.prefix = merged["uri"], merged.get("prefix", "")

    @staticmethod
    def applies(properties: Mapping[str, Any]) -> bool:
        """Whether every property set is one these reads honour (SigV4 only with explicit keys)."""
        keys = {str(k) for k in properties}
        if str(properties.get("type", "")) != "rest" or not properties.get("uri"):
            return False
        if any(k not in UNDERSTOOD and not k.startswith(UNDERSTOOD_PREFIXES) for k in keys):
            return False
        if str(properties.get("rest.sigv4-enabled", "")).lower() == "true":
            return bool(properties.get("client.access-key-id") and properties.get("client.secret-access-key"))
        return True

    def _url(self, path: str, prefixed: bool = True) -> str:
        url = self.uri + ("v1/" if self.uri.endswith("/") else "/v1/")
        if prefixed:
            url += self.prefix
            url = url if url.endswith("/") else url + "/"
        return url + path

    def _get(self, url: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        if params:
            url = f"{url}?{urlencode(params)}"
        return json.loads(get(url, self.headers, self.signer))

    def metadata(self, namespace: str, name: str) -> dict[str, Any]:
        """The table's current metadata, as the server answers ``loadTable``.

        Raises:
            OSError: the server answered otherwise than 2xx (404 for a missing table), or not at all.
        """
        answer = self._get(self._url(f"namespaces/{quote(namespace, safe='')}/tables/{quote(name, safe='')}"))
        return answer["metadata"]

    def table_names(self) -> list[tuple[str, str]]:
        """Every (namespace, table) of the catalog's top-level namespaces, following page tokens."""
        names = []
        for namespace, *_rest in self._pages(self._url("namespaces"), "namespaces"):
            path = f"namespaces/{quote(namespace, safe='')}/tables"
            names += [(namespace, t["name"]) for t in self._pages(self._url(path), "identifiers")]
        return names

    def _pages(self, url: str, key: str) -> list[Any]:
        items: list[Any] = []
        token = None
        while True:
            answer = self._get(url, {"pageToken": token} if token else None)
            items += answer.get(key) or []
            token = answer.get("next-page-token")
            if not token:
                return items
