"""Progress of long work and summaries, for a terminal and for a log alike.

On a terminal a step shows a live status line (rich's spinner), rewritten in place. Where the
output is not a terminal (redirected to a file, a pipe, CI, Airflow's task log) that line would
print nothing at all, so a long step instead writes a plain line every ``interval_s`` seconds:
``<step>: <latest progress> (<seconds> s)``, and a run is never silent for minutes. Summaries
printed there are not hard-wrapped at rich's default 80 columns either: a log keeps each line
whole.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import IO, Callable, Iterator

from rich.console import Console

LOG_WIDTH = 100_000  # columns of a console that is not a terminal: no line is wrapped


def console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A rich console on stdout (or stderr, or ``file``) that wraps at the terminal's width on
    a terminal and not at all elsewhere."""
    made = Console(stderr=stderr, file=file)
    if not made.is_terminal:
        made.width = LOG_WIDTH
    return made


@contextlib.contextmanager
def progress(out: Console, what: str, interval_s: float) -> Iterator[Callable[[str], None]]:
    """Shows that ``what`` is running on ``out``; yields a function that sets its latest progress.

    A terminal gets a live status line; anything else a plain line every ``interval_s`` seconds
    while the step runs (none for a step shorter than that)."""
    if out.is_terminal:
        with out.status(what) as status:
            yield lambda line: status.update(f"{what}: {line}")
        return
    latest = [""]
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval_s):
            shown = f"{what}: {latest[0]}" if latest[0] else what
            out.file.write(f"{shown} ({time.monotonic() - started:.0f} s)\n")
            out.file.flush()

    thread = threading.Thread(target=beat, name="icelog-progress", daemon=True)
    thread.start()
    try:
        yield lambda line: latest.__setitem__(0, line)
    finally:
        done.set()
        thread.join()
