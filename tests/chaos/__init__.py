"""The chaos harness: a mixed workload across OS processes, killed hard and soft.

``tests.chaos.workers`` holds the worker entry points, ``tests.chaos.run`` the controller and
the end-of-run checks (``python -m tests.chaos.run --help``).
"""
