"""Request frames as clients send them: what kio alone would refuse and brokers accept."""

from __future__ import annotations

from icelog.pipelines.gateway import wire
from tests.gateway.raw import frame

# librdkafka 2.16's Metadata v9 request for every topic (AdminClient.list_topics()), as captured:
# after the four fields and their tagged section it carries a tagged field (tag 0) kio does not
# know, and a byte more.
LIST_TOPICS = b"\x00\x03\x00\t\x00\x00\x00\x03\x00\x07rdkafka\x00\x00\x00\x00\x00\x01\x00\x00\x00"


def test_unknown_tagged_fields_and_trailing_bytes_are_skipped_as_brokers_skip_them():
    request = wire.parse_request(LIST_TOPICS)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (3, 9, 3, "rdkafka")
    assert request.body.topics is None  # every topic


def test_known_tagged_fields_are_kept():
    # ApiVersions v3 has no tagged request fields; Fetch v12's cluster_id is tag 0 of the request.
    body = {"cluster_id": "c1", "max_wait": 0, "min_bytes": 1, "topics": [], "forgotten_topics_data": []}
    data = frame(1, 12, body)[4:]
    assert wire.parse_request(data).body.cluster_id == "c1"
    # the same request with an unknown tag 7 after the known tag 0: 0 is kept, 7 dropped
    assert data[-6:] == b"\x01\x00\x03\x03c1"
    mixed = data[:-6] + b"\x02\x00\x03\x03c1\x07\x02zz"
    assert wire.parse_request(mixed).body.cluster_id == "c1"
