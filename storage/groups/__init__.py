"""Consumer groups: committed offsets with individually committed ranges, membership,
key-hash-range assignment and the Kafka-shaped consumer (I10).

May import: ``storage.log``, ``storage.core``, ``storage.errors``, ``storage.properties``; the
consumer (``consumer``) alone also ``storage.producers``: where a catalog cannot commit several
tables at once, its ``commit(also=...)`` is a transaction.
"""
