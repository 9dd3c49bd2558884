"""icelog storage: Kafka partition-log semantics on Apache Iceberg tables (via pyiceberg).

Packages, each importing only those listed before it: ``errors``, then ``properties`` and ``settings``, ``core``
(the commit core), ``log`` (log tables), ``ingest`` and ``groups``, ``producers``,
``replication``, then ``admin`` (maintenance and orphan cleanup, over all of them). Nothing here imports ``validations``, ``pipelines`` or ``dags``; logging is
configured by the entry points (``storage.telemetry``).
"""
