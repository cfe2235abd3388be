"""What the audit finds: each execution, each job and each side of the run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass
class Attempt:
    """One execution of a job, from the ledger."""

    n: int
    pid: int
    ppid: int
    start: float
    end: float | None = None
    reason: str = ''


@dataclass
class JobAudit:
    """Everything known about one job at the end of a side's run."""

    id: str
    kind: str
    status: str
    state: str  # finished | failed | lost | stuck
    attempts: list[Attempt]
    callbacks: int
    stalled: int
    exempt: int
    retries_spent: int
    results: int
    failure: str
    where: str
    #: Results written by a worker's execution (RQ records the worker's name on them);
    #: a sweep's dead letter and stock's abandoned-job failure carry none.
    worker_results: int = 0
    #: Kills and freezes of workers that took the job (their log names it) but never began it
    #: (no execution of theirs in the ledger): a worker hit between its take and its horse.
    held_faults: int = 0
    #: The truth about its executions' deaths (kills, freezes, pill starts; see
    #: ``audit.judge_deaths``): leases that ran out while the server process that granted
    #: them served, and before any restart or failover (should count); those the boundary
    #: came first for (should not); those within one sweep interval of a boundary (the band).
    deaths_count: int = 0
    deaths_band: int = 0
    deaths_exempt: int = 0

    @property
    def deaths_uncounted(self) -> int:
        """Deaths that should count and were not counted."""
        return max(0, self.deaths_count - self.stalled)

    @property
    def deaths_counted_wrongly(self) -> int:
        """Counted stalls beyond every death that should or may count."""
        return max(0, self.stalled - self.deaths_count - self.deaths_band)

    @property
    def stale_outcomes(self) -> int:
        """Outcomes that landed from an execution other than the one that ended the job."""
        return max(0, self.worker_results - (1 if self.state == 'finished' else 0))

    @property
    def deploy_stalls(self) -> int:
        """Counted stalls of a healthy job that a deploy stopped, beyond the kills and freezes of its
        workers: stalls a deploy cost it (rq-epoch must count none)."""
        if self.kind != 'healthy' or not any(a.reason == 'deploy' for a in self.attempts):
            return 0
        hits = sum(1 for a in self.attempts if a.reason in ('kill', 'freeze')) + self.held_faults
        return max(0, self.stalled - hits)

    @property
    def executions(self) -> int:
        """Number of executions (ledger start lines)."""
        return len(self.attempts)


@dataclass
class SideResult:
    """The audit of one side."""

    side: str
    wall: float
    jobs: list[JobAudit]
    events: list[dict[str, Any]]
    violations: list[str]
    histories: dict[str, list[str]]
    notes: list[str]
    max_stalled: int
    #: Outcomes the fence refused (rq-epoch's per-queue counter; 0 for stock).
    refused: int = 0
    #: Stalls counted by a server process other than the one that stamped the lease (rq-epoch):
    #: deaths whose lease ran out before a restart or failover, counted after it.
    counted_later: int = 0
    #: Jobs a stopping worker handed back, and leases requeued under the ``stopping`` verdict
    #: (rq-epoch's per-queue counters; 0 for stock).
    handed_back: int = 0
    stopping: int = 0

    def row(self) -> dict[str, Any]:
        """The audit table's row, as numbers and short texts."""
        healthy = [j for j in self.jobs if j.kind == 'healthy']
        pills = [j for j in self.jobs if j.kind == 'pill']
        failed = [j for j in healthy if j.state == 'failed']
        superseded: Counter[str] = Counter(a.reason for j in healthy for a in j.attempts[:-1])
        multi = [j for j in healthy if j.executions > 1]
        failed_why: Counter[str] = Counter(
            f'{failure_kind(j.failure)} after {j.attempts[-1].reason}'
            if j.attempts
            else f'{failure_kind(j.failure)}, never started'
            for j in failed
        )
        dead = [p for p in pills if p.state == 'failed']
        events = Counter(e['kind'] for e in self.events)
        restarts = [e for e in self.events if e['kind'] == 'server-down']
        return {
            'side': self.side,
            'jobs': len(self.jobs),
            'finished': sum(1 for j in self.jobs if j.state == 'finished'),
            'healthy': len(healthy),
            'healthy_finished': sum(1 for j in healthy if j.state == 'finished'),
            'healthy_failed': len(failed),
            'healthy_failed_why': dict(failed_why),
            'pills': len(pills),
            'pills_dead': len(dead),
            'pill_stalls': [p.stalled for p in dead],
            'pill_executions': [p.executions for p in pills],
            'lost': sum(1 for j in self.jobs if j.state == 'lost'),
            'stuck': sum(1 for j in self.jobs if j.state == 'stuck'),
            'max_executions': max((j.executions for j in healthy), default=0),
            'ran_more_than_once': len(multi),
            'superseded_executions': dict(superseded),
            'never_ran': sum(1 for j in healthy if j.executions == 0),
            'retries_spent': sum(j.retries_spent for j in self.jobs),
            'counted_stalls_healthy': sum(j.stalled for j in healthy),
            'deaths_should_count': sum(j.deaths_count for j in self.jobs),
            'deaths_band': sum(j.deaths_band for j in self.jobs),
            'deaths_exempt': sum(j.deaths_exempt for j in self.jobs),
            'deaths_counted': sum(j.stalled for j in self.jobs),
            'deaths_uncounted': sum(j.deaths_uncounted for j in self.jobs),
            'deaths_counted_wrongly': sum(j.deaths_counted_wrongly for j in self.jobs),
            'deaths_counted_later': self.counted_later,
            'pill_deaths': [
                {
                    'executions': p.executions,
                    'should_count': p.deaths_count,
                    'band': p.deaths_band,
                    'restart_first': p.deaths_exempt,
                }
                for p in pills
            ],
            'uncounted_recoveries': sum(j.exempt for j in self.jobs),
            'callbacks_run': sum(j.callbacks for j in self.jobs),
            'jobs_with_two_outcomes': sum(1 for j in self.jobs if j.results > 1),
            'stale_outcomes_landed': sum(j.stale_outcomes for j in self.jobs),
            'stale_outcomes_refused': self.refused,
            'restarts': len(restarts),
            'restarts_crash': sum(1 for e in restarts if e.get('crash')),
            'kills': events['kill'],
            'freezes': events['freeze'],
            'failovers': events['failover'] - events['failover-refused'],
            'primary_freezes': events['primary-freeze'],
            'faults_skipped': events['fault-skipped'],
            'worker_exits': events['worker-exit'],
            'worker_exits_own': sum(
                1 for e in self.events if e['kind'] == 'worker-exit' and e['cause'] not in ('harness kill', 'deploy')
            ),
            'deploys': events['deploy-done'],
            'deploy_stops': events['deploy-stop'],
            'deploy_sequences': dict(Counter(e['sequence'] for e in self.events if e['kind'] == 'deploy-stop')),
            'deploy_kills': events['deploy-kill'],
            'handed_back': self.handed_back,
            'stopping_verdicts': self.stopping,
            'deploy_stalls': sum(j.deploy_stalls for j in healthy),
            'healthy_failed_after_deploy': sum(1 for j in failed if j.attempts and j.attempts[-1].reason == 'deploy'),
            'orphans_ended': events['orphan-ended']
            + sum(len(e.get('ended_leftovers', [])) for e in self.events if e['kind'] == 'worker-exit'),
            'wall_seconds': round(self.wall, 1),
            'violations': len(self.violations),
        }


def failure_kind(failure: str) -> str:
    """A short name for a failure text: the exception that failed the job."""
    for name in ('AbandonedJobError', 'StalledJobError', 'JobTimeoutException'):
        if name in failure:
            return name
    if 'terminated unexpectedly' in failure or 'Work-horse' in failure:
        return 'work-horse died'
    if 'intermediate queue' in failure:
        return 'stuck in the intermediate queue'
    return failure[:40] or '(no reason)'
