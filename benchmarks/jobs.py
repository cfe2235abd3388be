"""Job functions and callbacks the benchmarks enqueue (importable by workers as ``benchmarks.jobs``)."""

from __future__ import annotations

import time
from typing import Any

#: How many times :func:`on_failure_count` ran in this process (the sweeps run callbacks in-process).
FAILURE_CALLBACKS = 0


def noop() -> None:
    """Do nothing: the cost measured is the worker's own."""


def noop_with(payload: str) -> int:
    """Do nothing with an argument (a job hash with a larger ``data`` field)."""
    return len(payload)


def sleep_for(seconds: float) -> float:
    """Sleep, so that a worker sends heartbeats while the job runs."""
    time.sleep(seconds)
    return seconds


def on_failure_count(job: Any, connection: Any, *exc_info: Any) -> None:
    """A failure callback that costs nothing but proves it ran."""
    global FAILURE_CALLBACKS
    FAILURE_CALLBACKS += 1


def record_start_then_sleep(path: str, seconds: float) -> float:
    """Append ``<unix time> <pid> <ppid>`` to ``path`` at the start, then sleep."""
    import os

    with open(path, 'a', encoding='utf-8') as fh:
        fh.write(f'{time.time():.3f} {os.getpid()} {os.getppid()}\n')
    time.sleep(seconds)
    return seconds
