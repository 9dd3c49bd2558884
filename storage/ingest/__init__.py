"""Loading outside data exactly once: bulk loads resumable by load id, and the ingest ledger (I9).

May import: ``storage.log``, ``storage.core``, ``storage.errors``, ``storage.properties``.
"""
