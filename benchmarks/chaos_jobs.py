"""Job functions of the chaos run, and its ledger: a record of executions kept outside Redis.

Every execution appends one line when it starts and one when it ends to an append-only
ledger file, so the audit counts executions without trusting the queue. A line is one
``write`` of well under ``PIPE_BUF`` bytes on a file opened with ``O_APPEND``, so lines of
concurrent work-horses never interleave. The attempt number comes from marker files
created with ``O_EXCL`` (``<ledger>.d/<job>.<n>``): two executions of one job can never
get the same number, even when they run at the same time.

Ledger line: ``<event> <job_id> <attempt> <pid> <ppid> <unix time> [detail]`` where event
is ``start``, ``end`` or ``callback``; pid is the work-horse and ppid its worker.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

__all__ = ['append', 'next_attempt', 'on_failure', 'poison_pill', 'work']

#: Bound on the attempt numbers tried by :func:`next_attempt`.
MAX_ATTEMPTS = 10_000


def append(ledger: str, event: str, job_id: str, attempt: int, detail: str = '') -> None:
    """Append one line to the ledger (one ``write`` with ``O_APPEND``)."""
    line = f'{event} {job_id} {attempt} {os.getpid()} {os.getppid()} {time.time():.3f}'
    if detail:
        line += ' ' + detail.replace('\n', ' ')[:200]
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + '\n').encode())
    finally:
        os.close(fd)


def next_attempt(ledger: str, job_id: str) -> int:
    """The number of this execution of ``job_id``: 1 for the first, unique per execution."""
    folder = ledger + '.d'
    os.makedirs(folder, exist_ok=True)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            fd = os.open(os.path.join(folder, f'{job_id}.{attempt}'), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return attempt
    raise RuntimeError(f'more than {MAX_ATTEMPTS} attempts of {job_id}')


def work(ledger: str, job_id: str, seconds: float) -> str:
    """A healthy job: record the start, work for ``seconds``, record the end."""
    attempt = next_attempt(ledger, job_id)
    append(ledger, 'start', job_id, attempt)
    time.sleep(seconds)
    append(ledger, 'end', job_id, attempt)
    return job_id


def poison_pill(ledger: str, job_id: str) -> None:
    """Take the whole worker down, worker process and work-horse, as an OOM kill would."""
    attempt = next_attempt(ledger, job_id)
    append(ledger, 'start', job_id, attempt)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def on_failure(job: Any, connection: Any, typ: Any, value: Any, traceback: Any) -> None:
    """``on_failure`` callback: record the call in the job's ledger (its first argument)."""
    name = getattr(typ, '__name__', str(typ))
    append(str(job.args[0]), 'callback', job.id, 0, name)
