"""Sweep tickets: the fleet sweeps each queue about once per sweep interval, not once per worker.

Every worker wakes once per sweep interval to sweep its queues. Before it sweeps, it asks
the ``ticket`` script (``lua/ticket.lua``), in one call for all its queues, which of them
nobody has swept lately by the server's clock, and sweeps only those. However many workers
listen on a queue, its sweep script runs about once per interval. The cron sweep
(``rq-epoch sweep``) asks for no ticket: it judges whenever it is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import keys, scripts

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['SweepTickets', 'take_tickets', 'ticket_min_age_ms']


@dataclass(frozen=True)
class SweepTickets:
    """The reply of the ``ticket`` script."""

    #: The server's time of the call, in milliseconds.
    now_ms: int
    #: The queues the caller won: it sweeps these now, nobody else does until the next interval.
    granted: tuple[str, ...]


def ticket_min_age_ms(interval: float) -> int:
    """How old a queue's last ticket must be for a new one: the interval less a tenth.

    The worker that won the last ticket asks again one interval later by its own clock;
    the tenth absorbs the difference between its clock and the server's, so that it wins
    again if nobody swept the queue in between, rather than one interval later still.
    """
    return max(1, int(interval * 900))


def take_tickets(connection: Redis, queue_names: Sequence[str], interval: float) -> SweepTickets:
    """Ask for the sweep tickets of ``queue_names`` (one script call); returns the queues won."""
    names = list(queue_names)
    reply = scripts.ticket()(connection, [keys.tickets_key()], [ticket_min_age_ms(interval), keys.PREFIX, *names])
    flags = [int(flag) for flag in reply[1:]]
    return SweepTickets(
        now_ms=int(reply[0]), granted=tuple(name for name, flag in zip(names, flags, strict=True) if flag)
    )
