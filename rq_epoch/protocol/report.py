"""What a sweep decided: one :class:`LeaseVerdict` per lease, gathered in a :class:`SweepReport`."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .server import PrimaryState
from .verdicts import Verdict

__all__ = ['LeaseVerdict', 'SweepReport']


@dataclass(frozen=True)
class LeaseVerdict:
    """What the sweep decided for one expired lease."""

    queue: str
    member: str
    job_id: str
    verdict: Verdict
    stalled: int
    max_stalled: int
    lease_epoch: str
    run_id: str

    @property
    def counted(self) -> bool:
        """True when this verdict counted a stall (recovered or dead)."""
        return self.verdict.counted


@dataclass
class SweepReport:
    """Everything one sweep did, for the worker's log, the CLI, or your own monitoring."""

    run_id: str = ''
    #: Seconds the server process had been up when the last sweep script call ran.
    uptime: int = 0
    dry_run: bool = False
    queues: list[str] = field(default_factory=list)
    verdicts: list[LeaseVerdict] = field(default_factory=list)
    #: Dead letters whose side effects (result, callback, dependents) this sweep ran.
    finished: list[str] = field(default_factory=list)
    #: The server's role and primary epoch as the last script call saw them.
    primary: PrimaryState | None = None
    #: Script calls whose counted verdicts no replica acknowledged (``WAIT``) in time;
    #: the side effects of dead letters are not run by a sweep that has any.
    unconfirmed: int = 0

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Number of leases per verdict (every verdict listed, zeros included)."""
        counter = Counter(v.verdict for v in self.verdicts if queue is None or v.queue == queue)
        return {verdict.value: counter.get(verdict, 0) for verdict in Verdict}

    @property
    def total(self) -> int:
        """Leases given a verdict (deferred ones excluded)."""
        return sum(1 for v in self.verdicts if v.verdict.judged)

    def by_job(self, job_id: str) -> list[LeaseVerdict]:
        return [v for v in self.verdicts if v.job_id == job_id]

    @property
    def judged(self) -> bool:
        """False when the server was a replica or an isolated primary: nothing was judged."""
        return self.primary is None or self.primary.judges

    def merge(self, other: SweepReport) -> None:
        self.run_id = other.run_id or self.run_id
        self.uptime = other.uptime or self.uptime
        self.primary = other.primary or self.primary
        self.unconfirmed += other.unconfirmed
        self.queues.extend(q for q in other.queues if q not in self.queues)
        self.verdicts.extend(other.verdicts)
        self.finished.extend(other.finished)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: totals per queue and every verdict."""
        return {
            'run_id': self.run_id,
            'uptime': self.uptime,
            'dry_run': self.dry_run,
            'queues': {name: self.counts(name) for name in self.queues},
            'totals': self.counts(),
            'finished': list(self.finished),
            'verdicts': [asdict(v) for v in self.verdicts],
            'primary': None if self.primary is None else {**asdict(self.primary), 'state': self.primary.state},
            'unconfirmed': self.unconfirmed,
        }
