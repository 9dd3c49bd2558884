"""``icelog consume`` and ``icelog groups``: consumer groups with range commits."""

from __future__ import annotations

from pipelines.cli import cli  # noqa: F401 - commands register on this group
