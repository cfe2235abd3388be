"""What a worker knows of its server: the epoch it last saw, and whether it can reach it now.

A worker rides out a server that does not answer: its heartbeats, its outcomes and its idle
loop retry instead of failing. :class:`ServerContact` keeps the one account of that, shared by
the worker, its lease keeper thread (``SimpleWorker``) and a spawned work-horse: it logs one
line when the server is lost and one when it is back (with the epochs before and after), and
says what follows a change of epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import CONNECTION_ERRORS

__all__ = ['ServerContact']


class ServerContact:
    """The epoch a worker last saw and, while it cannot reach the server, since when.

    ``announced(run_id)`` says whether the epoch change to ``run_id`` was already logged (the
    :class:`~rq_epoch.worker.failover.PrimaryWatch` logs a failover itself). ``on_back()`` runs
    when the server answers again after an outage, ``on_new_epoch()`` when it answers with
    another run_id (the scripts must be loaded on the new server process); a connection
    error in either is left for the next contact.
    """

    def __init__(
        self,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any],
        name: str,
        run_id: str | None = None,
        announced: Callable[[str], bool],
        on_back: Callable[[], None],
        on_new_epoch: Callable[[], None],
    ) -> None:
        self.log = log
        self.name = name
        #: The run_id of the server process this worker last heard from (None before the first).
        self.run_id = run_id
        #: ``time.monotonic()`` of the first failure of the outage under way; None while reachable.
        self.lost_at: float | None = None
        self.announced = announced
        self.on_back = on_back
        self.on_new_epoch = on_new_epoch

    @property
    def reachable(self) -> bool:
        """Whether the last contact with the server succeeded."""
        return self.lost_at is None

    def lost(self, exc: BaseException) -> None:
        """A call to the server failed with a connection error: logged once per outage."""
        if self.lost_at is None:
            self.lost_at = time.monotonic()
            self.log.warning(
                'Worker %s: server unreachable (%s); keeping the work-horse running and retrying (last epoch %s)',
                self.name,
                exc,
                self.run_id,
            )

    def reached(self, run_id: str) -> None:
        """The server answered, as the process ``run_id``: log the way back and a new epoch."""
        if self.lost_at is not None:
            down = time.monotonic() - self.lost_at
            self.lost_at = None
            self.log.warning('Worker %s: server back after %.1fs; epoch %s -> %s', self.name, down, self.run_id, run_id)
            self._quietly(self.on_back)
        elif self.run_id and run_id != self.run_id and not self.announced(run_id):
            self.log.warning('Worker %s: server epoch changed %s -> %s', self.name, self.run_id, run_id)
        if run_id != self.run_id:
            self._quietly(self.on_new_epoch)
        self.run_id = run_id

    def _quietly(self, call: Callable[[], None]) -> None:
        try:
            call()
        except CONNECTION_ERRORS:
            pass
