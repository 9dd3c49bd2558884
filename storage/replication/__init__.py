"""Replication: offset-preserving mirrors to another catalog, writes with explicit offsets,
and the replicator permission (KIP-391, DESIGN I6).

May import: ``storage.producers``, ``storage.groups``, ``storage.log``, ``storage.core``,
``storage.errors``, ``storage.properties``.
"""
