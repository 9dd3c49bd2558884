"""Headless Chromium (Debian's, /usr/bin/chromium) for the tests that look at what users see:
the reports, the Data Docs and the Airflow UI. Screenshots go to test-artifacts/."""

from __future__ import annotations

from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
