"""The epoch rule: which expired leases count as stalls.

A lease is stamped with the ``run_id`` of the server process that granted or last
extended it. When the lease expires, the sweep compares that stamp with the ``run_id``
of the server process it is talking to now:

* the same process: the lease ran out while the server was up, so the worker really
  went away. The stall is *counted*.
* another process that was still serving as primary after the lease's deadline, by its
  own record of when it was last seen alive (:class:`SeenAlive`, ``<prefix>:epoch:alive``):
  the lease ran out under a live server, and the restart or failover only delayed the
  verdict. The stall is *counted*, at once (no restart grace). The deadline and the record
  are both that process's own ``TIME``: no two clocks are compared.
* anything else (another process not seen alive after the deadline, no stamp at all, an
  empty string): the lease may have crossed a server restart or failover, or was written
  before rq-epoch was installed. The lease is *exempt*: the job is requeued and its stall
  count is left alone.

A lease whose worker was told to stop carries a *stop mark* (:class:`StopMark`, written by the
``stopmark`` script with the server's ``TIME``). An expired lease that is marked by the
execution that held it, and whose deadline falls within the stop window after the mark
(:func:`within_stop_window`), was cut off by its worker's own stop (a deploy): it is requeued
uncounted, verdict ``stopping``. An unmarked lease, or one that ran out after the window, is
judged as above.

This module is pure: no I/O. The server-side scripts in ``rq_epoch/protocol/lua/`` apply the
same rule in Lua; the tests check both against the same vectors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    'ALIVE_MARGIN',
    'SeenAlive',
    'StopMark',
    'died_under',
    'is_counted',
    'is_exempt',
    'is_valid_run_id',
    'parse_run_id',
    'parse_seen_alive',
    'parse_stop_mark',
    'within_stop_window',
]

#: Seconds by which a process's last sign of life must pass a lease's deadline for the lease
#: to count as run out under it (against rounding: both are written with six decimals).
ALIVE_MARGIN = 0.01

RUN_ID_LENGTH = 40
_RUN_ID_RE = re.compile(f'[0-9a-f]{{{RUN_ID_LENGTH}}}')


def is_valid_run_id(value: str | bytes | None) -> bool:
    """Return True when ``value`` has the shape of a server run_id: exactly 40 of ``0-9a-f``."""
    if value is None:
        return False
    if isinstance(value, bytes):
        try:
            value = value.decode('ascii')
        except UnicodeDecodeError:
            return False
    return _RUN_ID_RE.fullmatch(value) is not None


def parse_run_id(info_server: str) -> str | None:
    """Extract ``run_id`` from the text of ``INFO server``; None when it is absent."""
    for line in info_server.splitlines():
        if line.startswith('run_id:'):
            return line[len('run_id:') :].strip()
    return None


@dataclass(frozen=True)
class SeenAlive:
    """A server process's record of life (``<prefix>:epoch:alive``, field its run_id).

    ``last``: when it was last seen serving as primary; ``first``: when that term as primary
    was first seen (a demotion and a promotion start a new term); both its own ``TIME``.
    """

    last: float
    first: float
    replid: str = ''


def parse_seen_alive(value: str | bytes | None) -> SeenAlive | None:
    """Read a record's value ``"<last> <master_replid> <first>"``; None when it has another shape."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode('ascii', 'replace')
    parts = value.split(' ')
    if len(parts) != 3:
        return None
    try:
        return SeenAlive(last=float(parts[0]), first=float(parts[2]), replid=parts[1])
    except ValueError:
        return None


def died_under(deadline: float | None, seen: SeenAlive | None) -> bool:
    """Whether a lease with this deadline ran out while its process was serving, as its record shows.

    The deadline falls within the recorded term, more than :data:`ALIVE_MARGIN` before the
    process's last sign of life.
    """
    if deadline is None or seen is None:
        return False
    return seen.first <= deadline and deadline + ALIVE_MARGIN < seen.last


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def is_counted(
    lease_epoch: str | bytes | None,
    current_run_id: str | bytes,
    *,
    deadline: float | None = None,
    seen_alive: SeenAlive | None = None,
) -> bool:
    """Return True when an expired lease stamped ``lease_epoch`` is a real stall.

    That is when the stamp is present and byte-equal to the current, valid run_id; or when it
    names another process whose record ``seen_alive`` (of the stamp's process) shows it
    serving as primary after the lease's ``deadline`` (see :func:`died_under`).
    """
    if not lease_epoch or not is_valid_run_id(current_run_id):
        return False
    if _as_bytes(lease_epoch) == _as_bytes(current_run_id):
        return True
    return died_under(deadline, seen_alive)


def is_exempt(
    lease_epoch: str | bytes | None,
    current_run_id: str | bytes,
    *,
    deadline: float | None = None,
    seen_alive: SeenAlive | None = None,
) -> bool:
    """Return True when an expired lease may have crossed a restart or failover (or was never stamped)."""
    return not is_counted(lease_epoch, current_run_id, deadline=deadline, seen_alive=seen_alive)


@dataclass(frozen=True)
class StopMark:
    """A lease marked *stopping*: the job hash's ``stop_mark`` field, ``"<execution_id> <marked_at> <until>"``.

    ``marked_at`` is the server's ``TIME`` when the worker, told to stop, marked the lease;
    ``until`` is the end of the stop window (``marked_at`` plus the worker's
    :attr:`rq_epoch.settings.EpochSettings.stop_window`), server time too.
    """

    execution_id: str
    marked_at: float
    until: float


def parse_stop_mark(value: str | bytes | None) -> StopMark | None:
    """Read a ``stop_mark`` field; None when it is missing or has another shape."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode('utf-8', 'replace')
    parts = value.split(' ')
    if len(parts) != 3 or not parts[0]:
        return None
    try:
        return StopMark(execution_id=parts[0], marked_at=float(parts[1]), until=float(parts[2]))
    except ValueError:
        return None


def within_stop_window(execution_id: str | None, deadline: float | None, mark: StopMark | None) -> bool:
    """Whether an expired lease of ``execution_id`` ran out within its stop window.

    True when the lease is marked by that same execution and its ``deadline`` falls from the
    mark to the end of the window, both included. A lease that had already run out when it
    was marked, one marked by an earlier execution of the job, or one that ran out after the
    window is judged by the epoch rule instead.
    """
    if mark is None or deadline is None or not execution_id or mark.execution_id != execution_id:
        return False
    return mark.marked_at <= deadline <= mark.until
