"""Worked examples built on the public storage API (each runnable with ``python -m``)."""
