"""Log table names: ``namespace.table``, or a bare ``table`` in namespace ``logs``; and the
names of the system columns every log table has.

Standard library only, so a command that only reads a table's name and state (``icelog
offsets``) does not import pyarrow or pyiceberg's schema types to check one.
"""

from __future__ import annotations

import re

from icelog.storage.errors import InvalidIdentifier

DEFAULT_NAMESPACE = "logs"
PARTITION = "log_partition"
OFFSET = "log_offset"
TIMESTAMP = "log_timestamp"
PRODUCER_ID = "producer_id"
PRODUCER_EPOCH = "producer_epoch"
PRODUCER_SEQ = "producer_seq"
# The key hash of the table's key column (storage.log.keys.key_hash), filled by every writer; files
# of many rows are written clustered by it so key-range reads skip row groups (storage.log.files).
KEY_HASH = "log_key_hash"
HASH_SPACE = 65536  # a key hash is 0..HASH_SPACE - 1 (storage.log.keys)
SYSTEM_COLUMNS = (PARTITION, OFFSET, TIMESTAMP, PRODUCER_ID, PRODUCER_EPOCH, PRODUCER_SEQ, KEY_HASH)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def parse_identifier(identifier: str) -> tuple[str, str]:
    """Split ``namespace.table`` (or ``table``, in namespace ``logs``) and validate both parts.

    Raises:
        InvalidIdentifier: a part is empty or has characters other than letters, digits, ``_``.
    """
    if not isinstance(identifier, str):
        raise InvalidIdentifier(identifier=repr(identifier), reason="must be a string")
    parts = identifier.split(".")
    if len(parts) == 1:
        parts = [DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 2:
        raise InvalidIdentifier(identifier=identifier, reason="use NAMESPACE.TABLE")
    for part in parts:
        if not _NAME.match(part):
            raise InvalidIdentifier(
                identifier=identifier,
                reason="each part must start with a letter or _ and hold only letters, digits and _",
            )
    return parts[0], parts[1]


def qualified(identifier: str) -> str:
    return ".".join(parse_identifier(identifier))
