"""icelog storage: Kafka partition-log semantics on Apache Iceberg tables (via pyiceberg)."""

import logging
import os
import sys

import structlog

if not structlog.is_configured():
    # Library default: warnings and up on stderr; ICELOG_LOG_LEVEL=debug shows every commit.
    _level = logging.getLevelName(os.environ.get("ICELOG_LOG_LEVEL", "WARNING").upper())
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(_level if isinstance(_level, int) else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
