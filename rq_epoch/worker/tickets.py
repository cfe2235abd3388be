"""Sweep tickets: the fleet sweeps each queue about once per sweep interval, not once per worker.

A worker sweeps its queues when RQ's loop comes round. Before it sweeps, it asks the
``ticket`` script (``lua/ticket.lua``), in one call for all its queues, which of them nobody
has swept lately by the server's clock, and sweeps only those. However many workers listen
on a queue, its sweep script runs about once per interval. A worker that won nothing is
given its turn to ask again, one sweep interval after the last turn given to a worker of
the same queues: however many workers there are, about one of them asks per interval
besides the one that sweeps (and the watcher of an idle fleet, which sweeps for it). The cron sweep
(``rq-epoch sweep``) asks for no ticket: it judges whenever it is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..protocol import keys, verbs
from ..protocol.verbs import SweepTickets

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['SweepTickets', 'take_tickets', 'ticket_min_age_ms']


def ticket_min_age_ms(interval: float) -> int:
    """How old a queue's last ticket must be for a new one: the interval less a tenth.

    The worker that won the last ticket asks again one interval later by its own clock;
    the tenth absorbs the difference between its clock and the server's, so that it wins
    again if nobody swept the queue in between, rather than one interval later still.
    """
    return max(1, int(interval * 900))


def take_tickets(
    connection: Redis, queue_names: Sequence[str], interval: float, turn: tuple[float, int] | None = None
) -> SweepTickets:
    """Ask for the sweep tickets of ``queue_names`` (one script call); returns the queues won.

    ``turn``: the gap between two turns (seconds) and the turn the caller was given last
    (server ms, or 0): when it wins nothing, the reply gives it its turn to ask again, in
    the line of its set of queues (``<prefix>:epoch:sweepturns:<set>``, see ``ticket.lua``).
    None for a caller that asks every interval whatever it wins (the watcher of an idle fleet).
    """
    names = list(queue_names)
    script_keys, args = [keys.tickets_key()], [ticket_min_age_ms(interval), keys.PREFIX, *names]
    if turn is not None:
        gap, kept = turn
        script_keys.append(keys.sweep_turns_key(keys.queue_set_id(keys.queue_key(name) for name in names)))
        args += [max(1, int(gap * 1000)), kept]
    return verbs.ticket(connection, script_keys, args, names)
