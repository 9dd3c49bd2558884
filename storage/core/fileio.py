"""The FileIO icelog opens tables with: pyiceberg's ``PyArrowFileIO``, with S3 writes of small
files in one request.

pyarrow's S3 output stream starts a multipart upload when it is opened, so every file is at least
three requests (create, upload a part, complete), however small. An append writes three small
files before its catalog commit (the data file, its manifest, the manifest list), one after
another: on SeaweedFS a 30 KB file took 8.4 ms that way against 3.5 ms as one ``PutObject``
(BENCHMARKS.md). With ``allow_delayed_open`` pyarrow buffers the start of a file and
sends a file that fits in one part as a single ``PutObject``; larger files are still multipart.
Either upload makes the object appear whole or not at all, so nothing a reader sees changes; an
error of the store surfaces when the file is written or closed instead of when it is opened,
which every writer here already treats alike (an ``OSError``).

:func:`storage.core.catalog.open_catalog` names this class as ``py-io-impl`` unless the
configuration names a FileIO itself.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io import S3_RETRY_STRATEGY_IMPL
from pyiceberg.io.pyarrow import PyArrowFileIO


class LogFileIO(PyArrowFileIO):
    def _initialize_s3_fs(self, netloc: str | None) -> Any:
        from pyarrow.fs import S3FileSystem

        fs = super()._initialize_s3_fs(netloc)
        if self.properties.get(S3_RETRY_STRATEGY_IMPL):
            return fs  # pyarrow's pickled options do not carry a retry strategy: keep pyiceberg's as it is
        _, (options,) = fs.__reduce__()  # every option pyiceberg chose (pyarrow's own pickling)
        return S3FileSystem(**{**options, "allow_delayed_open": True})
