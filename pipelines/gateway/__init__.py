"""``icelog serve``: a Kafka-protocol gateway onto a catalog's log tables.

``server`` (asyncio framing and connections) dispatches to ``metadata`` (ApiVersions, Metadata,
InitProducerId, CreateTopics), ``produce`` (batches coalesced per table into ``LogTable.append``
commits) and ``fetch`` (Fetch and ListOffsets from the table's rows). ``wire`` turns frames into
kio's message types and back, ``records`` reads and writes v2 record batches, ``topics`` maps
topic names to tables and Kafka records to rows. ``storage`` never imports this package.
"""
