"""What the tests share, beside the fixtures (those are in the ``conftest.py`` of each folder).

* ``catalogs``: :class:`~tests.support.catalogs.CatalogSpec`, a catalog that crosses process
  boundaries, and a catalog without atomic multi-table commits.
* ``workers``: the programs tests start as OS processes (``python -m tests.support.workers.…``).
* the helpers test modules share, one module per concept: ``faults`` (kill -9 at a fault point),
  ``processes`` (racing worker processes), ``transactions``, ``mirror``, ``cli``, ``planting``
  (rows planted around icelog), ``files``, ``ingest``, ``spark``, ``interleave``, and the
  benchmarks' builders (``quality_bench``, ``mirror_bench``).

A test module imports from here, never from another test module (``tests/test_layout.py``).
"""
