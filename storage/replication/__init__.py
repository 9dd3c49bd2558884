"""Replication: offset-preserving mirrors to another catalog, writes with explicit offsets,
and the replicator permission (KIP-391; docs/guarantees.md#i6-mirrors-keep-offsets).

May import: ``storage.producers``, ``storage.groups``, ``storage.log``, ``storage.core``,
``storage.errors``, ``storage.properties``.
"""
