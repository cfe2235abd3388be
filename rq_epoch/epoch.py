"""The epoch rule: which expired leases count as stalls.

A lease is stamped with the ``run_id`` of the server process that granted or last
extended it. When the lease expires, the sweep compares that stamp with the ``run_id``
of the server process it is talking to now:

* the same process: the lease ran out while the server was up, so the worker really
  went away. The stall is *counted*.
* anything else (another process, no stamp at all, an empty string): the lease crossed
  a server restart or failover, or was written before rq-epoch was installed. The lease
  is *exempt*: the job is requeued and its stall count is left alone.

This module is pure: no I/O. The server-side scripts in ``rq_epoch/lua/`` apply the
same rule in Lua; the tests check both against the same vectors.
"""

from __future__ import annotations

import re

__all__ = ['is_counted', 'is_exempt', 'is_valid_run_id', 'parse_run_id']

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


def is_counted(lease_epoch: str | bytes | None, current_run_id: str | bytes) -> bool:
    """Return True when an expired lease stamped ``lease_epoch`` is a real stall.

    That is exactly when the stamp is present and byte-equal to the current, valid run_id.
    """
    if lease_epoch is None or not is_valid_run_id(current_run_id):
        return False
    if isinstance(lease_epoch, str):
        lease_epoch = lease_epoch.encode()
    if isinstance(current_run_id, str):
        current_run_id = current_run_id.encode()
    return lease_epoch == current_run_id


def is_exempt(lease_epoch: str | bytes | None, current_run_id: str | bytes) -> bool:
    """Return True when an expired lease crossed a restart or failover (or was never stamped)."""
    return not is_counted(lease_epoch, current_run_id)
