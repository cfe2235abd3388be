"""The verdicts a sweep gives an expired lease, each with its log level and its wording.

A :class:`Verdict` is a ``str``: it compares equal to its name (``Verdict.DEAD == 'dead'``),
hashes like it, and serialises to it in JSON, so reports and scripts that use the plain
names keep working.
"""

from __future__ import annotations

import logging
from enum import Enum

__all__ = ['Verdict']


class Verdict(str, Enum):
    """One verdict, in the order reports list them.

    ``level`` is the level the sweep logs it at; ``wording`` is how the CLI spells it on a
    line of its own.
    """

    level: int
    wording: str

    def __new__(cls, value: str, level: int = logging.INFO, wording: str = '') -> Verdict:
        member = str.__new__(cls, value)
        member._value_ = value
        member.level = level
        member.wording = wording
        return member

    #: The job hash is gone: the lease is dropped.
    GHOST = 'ghost', logging.INFO, 'ghost (job gone)'
    #: The lease entry cannot be read: it is dropped.
    CORRUPT = 'corrupt', logging.WARNING, 'corrupt'
    #: The job is no longer started (its outcome landed): the lease is dropped.
    SETTLED = 'settled', logging.INFO, 'settled (job no longer started)'
    #: The lease crossed a server restart or failover: requeued, not counted.
    EXEMPT = 'exempt', logging.INFO, 'exempt (crossed a restart, not counted)'
    #: The worker was told to stop (a deploy) and killed before it could hand the job back;
    #: the lease ran out within its stop window: requeued, not counted.
    STOPPING = 'stopping', logging.INFO, 'stopping (its worker was stopped, not counted)'
    #: The worker died while the server stayed up: the stall is counted, the job requeued.
    RECOVERED = 'recovered', logging.WARNING, 'recovered (counted stall, requeued)'
    #: A counted stall that exhausted the job's budget: dead-lettered to FailedJobRegistry.
    DEAD = 'dead', logging.ERROR, 'dead (dead-lettered)'
    #: A lease of an older server process inside the restart grace: left for a later sweep.
    DEFERRED = 'deferred', logging.DEBUG, 'deferred (restart grace)'

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)

    def __hash__(self) -> int:
        return hash(self.value)

    @property
    def counted(self) -> bool:
        """Whether this verdict counts a stall against the job's budget (recovered, dead)."""
        return self in (Verdict.RECOVERED, Verdict.DEAD)

    @property
    def judged(self) -> bool:
        """Whether the lease was decided (every verdict but deferred, which waits for the grace)."""
        return self is not Verdict.DEFERRED

    @property
    def uncounted(self) -> bool:
        """Whether the lease is (or would be) requeued without a counted stall (exempt, stopping, deferred)."""
        return self in (Verdict.EXEMPT, Verdict.STOPPING, Verdict.DEFERRED)
