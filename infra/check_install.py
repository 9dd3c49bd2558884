"""Fail when two installed distributions own one file.

pip and uv install wheels one after another, and a later wheel silently overwrites files an
earlier one wrote (pyspark and pyspark-client both ship ``pyspark/``): which copy a fresh
machine imports then depends on install order. ``make setup`` runs this after every sync.

Usage: python -m infra.check_install
"""

from __future__ import annotations

import sys
from collections import defaultdict
from importlib import metadata


def shared_files() -> dict[str, set[str]]:
    """Map every installed file owned by more than one distribution to its owners."""
    owners: dict[str, set[str]] = defaultdict(set)
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        for path in dist.files or ():
            text = str(path)
            # Byte-code caches and the dist-info folders are per install, not package content.
            if "__pycache__" in text or ".dist-info/" in text:
                continue
            owners[str(path.locate())].add(name)
    return {path: names for path, names in owners.items() if len(names) > 1}


def main() -> int:
    shared = shared_files()
    if not shared:
        return 0
    by_owners: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for path, names in shared.items():
        by_owners[tuple(sorted(names))].append(path)
    for names, paths in sorted(by_owners.items()):
        print(f"error: {' and '.join(names)} both install {len(paths)} file(s), e.g. {sorted(paths)[0]}", file=sys.stderr)
    print(
        "Keep one owner per file: add the unwanted distribution to infra/lock-excludes.txt, run `make lock`, "
        "then `make clean setup`.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
