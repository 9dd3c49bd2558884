"""Programs the tests run as OS processes, to race them or kill them (-9) at a fault point.

Each is started as ``python -m tests.support.workers.<name> ARGS`` from the repository root and
prints one JSON line per event on stdout, flushed at once, so a parent reads every event that
happened before a kill. The chaos runner's workers are ``tests.chaos.workers``.
"""
