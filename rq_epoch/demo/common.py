"""What every part of the demo shares: its short timings, its error, the paths of its job functions."""

from __future__ import annotations

from ..errors import RqEpochError

__all__ = ['DemoError']

#: The demo's short timings (seconds). RQ's own lease margin is 60 s, rq-epoch's default 30 s.
HEARTBEAT = 1
LEASE_MARGIN = 2
RESTART_GRACE = 4
#: How long the server stays down in the restart act.
DOWNTIME = 4.0
#: Stall budget of every job in the rq-epoch story.
MAX_STALLED = 2
SWEEP_EVERY = 0.5
TICK = 0.1

#: Dotted paths of the demo's job functions and of its stock worker (see :mod:`rq_epoch.demo.jobs`).
WORK = 'rq_epoch.demo.jobs.work'
PILL = 'rq_epoch.demo.jobs.poison_pill'
STOCK_WORKER = 'rq_epoch.demo.jobs.ShortLeaseStockWorker'


class DemoError(RqEpochError):
    """The demo could not play its story (no server, a step that never happened, ...)."""


def short(run_id: str | None) -> str:
    """The first characters of a run_id, enough to tell two epochs apart in the narration."""
    return (run_id or '(none)')[:8]
