"""``icelog mirror`` and ``icelog acls``: offset-preserving replication and its permission."""

from __future__ import annotations

from pipelines.cli import cli  # noqa: F401 - commands register on this group
