"""OpenLineage datasets for what an icelog operator read and wrote.

With Airflow's OpenLineage provider installed (``icelog[lineage]``), its listener asks each
operator for ``get_openlineage_facets_on_complete`` after the task ran; icelog's operators
answer from what the run did (:class:`Lineage`), so the datasets are the ones really read and
written, not a guess made at parse time.

Naming follows the Asset URIs (``icelog.provider.assets``): a log table is the dataset
``namespace = icelog://<catalog>``, ``name = <namespace>.<table>``, so a table and its mirror
in another catalog are two datasets, and the provider's ``icelog://`` Assets convert to the
same datasets (:func:`convert_asset_to_openlineage`). Landing files are datasets of their file
system, as OpenLineage names files: ``file`` (or ``s3://<bucket>``) and the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from icelog.provider.assets import SCHEME, asset_uri


@dataclass(frozen=True)
class Lineage:
    """What one operator run read and wrote: entries made by :func:`table` and :func:`path`."""

    inputs: tuple[tuple[str, ...], ...] = ()
    outputs: tuple[tuple[str, ...], ...] = ()


def table(catalog: str, name: str) -> tuple[str, ...]:
    return ("table", catalog, name)


def path(uri: str) -> tuple[str, ...]:
    return ("path", uri)


def table_names(catalog: str, table: str) -> tuple[str, str]:
    """``(namespace, name)`` of a log table's dataset: the Asset URI's, split."""
    uri = urlsplit(asset_uri(table, catalog))
    namespace, name = uri.path.strip("/").split("/")
    return f"{SCHEME}://{uri.netloc}", f"{namespace}.{name}"


def path_names(path: str) -> tuple[str, str]:
    """``(namespace, name)`` of a file: ``s3://bucket`` and the key, or ``file`` and the absolute path."""
    uri = urlsplit(path)
    if uri.scheme and uri.scheme != "file":
        return f"{uri.scheme}://{uri.netloc}", uri.path.lstrip("/")
    return "file", uri.path if uri.scheme else path


def _datasets(entries: Iterable[tuple[str, ...]]) -> list[Any]:
    from airflow.providers.common.compat.openlineage.facet import Dataset

    return [Dataset(*(table_names(e[1], e[2]) if e[0] == "table" else path_names(e[1]))) for e in entries]


def operator_lineage(lineage: Lineage | None) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` of a run (empty before one)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    if lineage is None:
        return OperatorLineage()
    return OperatorLineage(inputs=_datasets(lineage.inputs), outputs=_datasets(lineage.outputs))


def convert_asset_to_openlineage(asset: Any, lineage_context: Any) -> Any:
    """An ``icelog://<catalog>/<namespace>/<table>`` Asset as its OpenLineage dataset (the
    provider's ``asset-uris`` converter)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    uri = urlsplit(asset.uri)
    namespace, name = uri.path.strip("/").split("/")
    return Dataset(namespace=f"{SCHEME}://{uri.netloc}", name=f"{namespace}.{name}")
