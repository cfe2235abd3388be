"""What happened to every job of a story: the verdicts and RQ's cleanup as they come, then the ledger."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rq.job import Job as RQJob
from rq.registry import StartedJobRegistry as RQStartedJobRegistry

from ..compat import text as _text
from ..jobs.job import Job
from ..protocol import keys
from ..protocol.report import LeaseVerdict
from ..protocol.verdicts import Verdict
from .common import MAX_STALLED, RESTART_GRACE
from .common import short as _short

if TYPE_CHECKING:
    from .runner import Demo


@dataclass
class DemoJob:
    """One job of a story: what the demo expects of it and what it saw happen to it."""

    tag: str
    about: str
    job_id: str
    healthy: bool = True
    retry: int = 0
    status: str = ''
    worker: str = ''
    lease_epoch: str = ''
    ever_failed: bool = False
    failure: str = ''
    verdicts: list[str] = field(default_factory=list)
    stock_events: list[str] = field(default_factory=list)
    deferred_told: bool = False
    runs: int = 0
    stalled: int = 0
    exempt: int = 0
    retries_left: int | None = None
    final: str = ''
    in_failed_registry: bool = False
    restamped: bool = False


class Ledger:
    """The jobs of one story and what became of them (the base of :class:`~rq_epoch.demo.story.Story`)."""

    demo: Demo
    epoch: bool
    label: str
    queue_name: str
    log_path: Path
    jobs: dict[str, DemoJob]

    def say(self, text: str) -> None:
        """Tell one line of the story."""
        self.demo.say(text)

    def events(self) -> list[tuple[str, str, int]]:
        """The job log's rows (event, tag, pid), as the jobs wrote them outside Redis."""
        rows = []
        with suppress(OSError):
            for line in self.log_path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 4:
                    rows.append((parts[1], parts[2], int(parts[3])))
        return rows

    def last_pid(self, tag: str) -> int | None:
        """The PID of the work-horse that last started ``tag``, from the job log."""
        pids = [pid for event, t, pid in self.events() if event == 'start' and t == tag]
        return pids[-1] if pids else None

    def failure_reason(self, job: DemoJob) -> str:
        """Why a job failed, in a few words, from its latest result."""
        job_class = Job if self.epoch else RQJob
        try:
            rq_job = job_class.fetch(job.job_id, connection=self.demo.connection)
            result = rq_job.latest_result()
        except Exception:  # noqa: BLE001 - a narration detail only
            return 'failed'
        text = _text(getattr(result, 'exc_string', '') or '')
        if 'AbandonedJobError' in text:
            return 'AbandonedJobError (RQ cleanup: lease expired)'
        if 'StalledJobError' in text:
            return 'StalledJobError (dead letter: stalled under a live server)'
        last = text.strip().splitlines()[-1] if text.strip() else 'failed'
        return last[:80]

    def job_for(self, job_id: str) -> DemoJob | None:
        """The job of this story with ``job_id``, if it is one."""
        for job in self.jobs.values():
            if job.job_id == job_id:
                return job
        return None

    def tell_verdict(self, v: LeaseVerdict) -> None:
        """Record a sweep verdict on its job and tell it in the narration."""
        job = self.job_for(v.job_id)
        tag = job.tag if job else v.job_id
        if v.verdict is Verdict.DEFERRED:
            if job and not job.deferred_told:
                job.deferred_told = True
                self.say(
                    f'sweep: {tag}: lease expired, stamped by the previous server process '
                    f'({_short(v.lease_epoch)}); waits for the restart grace ({RESTART_GRACE} s) so that a live '
                    'worker can re-stamp it first'
                )
            return
        if job:
            job.verdicts.append(v.verdict)
            if v.verdict in (Verdict.EXEMPT, Verdict.RECOVERED):
                job.status = 'queued'
                job.lease_epoch = ''
        if v.verdict is Verdict.RECOVERED:
            self.say(
                f'sweep: {tag}: lease expired under the same server process ({_short(v.run_id)}) -> a real stall: '
                f'counted {v.stalled}/{v.max_stalled}, requeued at the front'
            )
        elif v.verdict is Verdict.DEAD:
            self.say(
                f'sweep: {tag}: lease expired under the same server process ({_short(v.run_id)}) -> stall '
                f'{v.stalled}/{v.max_stalled}: dead-lettered to FailedJobRegistry'
            )
        elif v.verdict is Verdict.EXEMPT:
            self.say(
                f'sweep: {tag}: lease stamped by the previous server process ({_short(v.lease_epoch)}, now '
                f'{_short(v.run_id)}) -> exempt: requeued, not counted (stalls {v.stalled}/{v.max_stalled})'
            )
        else:
            self.say(f'sweep: {tag}: {v.verdict}')

    def stock_cleanup(self) -> None:
        """RQ's own cleanup of expired leases, as ``rq info`` and every stock worker run it."""
        conn = self.demo.connection
        registry = RQStartedJobRegistry(self.queue_name, connection=conn, job_class=RQJob)
        expired = [job_id for job_id in registry.get_expired_job_ids() if self.job_for(job_id)]
        if not expired:
            return
        before = {job_id: _text(conn.hget(keys.job_key(job_id), 'status')) for job_id in expired}
        registry.cleanup()
        for job_id in expired:
            job = self.job_for(job_id)
            if job is None or before[job_id] != 'started':
                continue
            after = _text(conn.hget(keys.job_key(job_id), 'status'))
            running = self.horse_alive(job)
            still = ' while its work-horse was still running it' if running else ''
            if after == 'failed':
                job.stock_events.append('failed' + (' while running' if running else ''))
                self.say(f"RQ's cleanup: {job.tag}: lease expired -> AbandonedJobError: failed{still}")
            elif after in ('queued', 'scheduled'):
                job.status = after
                job.stock_events.append('retry spent')
                self.say(f"RQ's cleanup: {job.tag}: lease expired -> AbandonedJobError: retry spent, requeued{still}")

    def horse_alive(self, job: DemoJob) -> bool:
        """Whether the work-horse that last started ``job`` is still running it."""
        pid = self.last_pid(job.tag)
        if pid is None:
            return False
        ends = [p for event, t, p in self.events() if event == 'end' and t == job.tag]
        return pid not in ends and self.demo.processes.is_ours(pid)

    def collect(self) -> None:
        """Final facts per job, from the server and the job log."""
        conn = self.demo.connection
        events = self.events()
        for job in self.jobs.values():
            job.runs = sum(1 for event, t, _pid in events if event == 'start' and t == job.tag)
            status, stalled, exempt, retries_left = (
                _text(x)
                for x in conn.hmget(keys.job_key(job.job_id), 'status', 'stalled', 'exempt_recoveries', 'retries_left')
            )
            job.final = status or 'gone'
            job.stalled = int(stalled) if stalled.isdigit() else 0
            job.exempt = int(exempt) if exempt.isdigit() else 0
            job.retries_left = int(retries_left) if retries_left.isdigit() else (0 if job.retry else None)
            job.in_failed_registry = conn.zscore(keys.failed_key(self.queue_name), job.job_id) is not None
            if job.in_failed_registry:
                job.ever_failed = True
            job_class = Job if self.epoch else RQJob
            with suppress(Exception):
                rq_job = job_class.fetch(job.job_id, connection=conn)
                if any(r.type.name == 'FAILED' for r in rq_job.results()):
                    job.ever_failed = True
            if job.ever_failed and not job.failure:
                job.failure = self.failure_reason(job)
            if self.epoch:
                # Verdicts given by a worker's own sweep, not seen by the demo's.
                seen_counted = sum(1 for v in job.verdicts if v in ('recovered', 'dead'))
                seen_exempt = job.verdicts.count('exempt')
                job.verdicts += ['recovered (by a worker)'] * max(0, job.stalled - seen_counted)
                job.verdicts += ['exempt (by a worker)'] * max(0, job.exempt - seen_exempt)

    # -- the ledger

    @property
    def healthy_failed(self) -> int:
        """How many healthy jobs ever failed."""
        return sum(1 for job in self.jobs.values() if job.healthy and job.ever_failed)

    @property
    def retries_spent(self) -> int:
        """How many retries the jobs with a retry budget spent."""
        jobs = [job for job in self.jobs.values() if job.retry and job.retries_left is not None]
        return sum(job.retry - (job.retries_left or 0) for job in jobs)

    def outcome(self, job: DemoJob) -> str:
        """What became of a job, in a few words."""
        if self.epoch:
            notes = []
            counted = job.stalled
            if counted:
                notes.append(f'{counted} counted stall{"s" if counted > 1 else ""}, rerun')
            if job.exempt:
                notes.append('exempt: rerun, not counted')
            if job.restamped:
                notes.append('lease re-stamped')
            if job.final == 'failed' and ('dead' in job.verdicts or job.stalled >= MAX_STALLED):
                head = f'dead-lettered (stalled {job.stalled}/{MAX_STALLED})'
                notes = []
            elif job.final == 'failed':
                head = f'FAILED ({job.failure})'
            else:
                head = job.final
        else:
            notes = list(dict.fromkeys(job.stock_events))
            if job.final == 'finished' and job.ever_failed:
                head = 'FAILED, then finished'
                notes = ['also in FailedJobRegistry'] if job.in_failed_registry else notes
            elif job.final == 'failed':
                head = 'FAILED' + (' (AbandonedJobError)' if 'Abandoned' in job.failure else f' ({job.failure})')
                notes = [n for n in notes if not n.startswith('failed')]
            else:
                head = job.final
                notes = [n for n in notes if n == 'retry spent']
        return head + (f' ({", ".join(notes)})' if notes else '')


def print_ledger(echo: Callable[[str], None], story: Ledger) -> None:
    """Print one story's ledger: per job, its runs, the verdicts or RQ's cleanup, and its outcome."""
    echo('')
    echo(f'Ledger ({story.label}):')
    echo(f'  {"job":<5} {"runs":>4}  {"verdicts" if story.epoch else "RQ cleanup":<26} final')
    for job in story.jobs.values():
        if story.epoch:
            what = ', '.join(job.verdicts) or '-'
        else:
            what = ', '.join(dict.fromkeys(job.stock_events)) or '-'
        echo(f'  {job.tag:<5} {job.runs:>4}  {what:<26} {story.outcome(job)}')


def print_side_by_side(echo: Callable[[str], None], epoch: Ledger, stock: Ledger) -> None:
    """Print both stories' outcomes per job, then the totals that tell them apart."""
    echo('')
    echo('Side by side:')
    rows = [('job', 'what happened to it', 'rq-epoch', 'stock RQ')]
    for tag, job in epoch.jobs.items():
        other = stock.jobs.get(tag)
        rows.append((tag, job.about, epoch.outcome(job), stock.outcome(other) if other else '-'))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        echo('  ' + '  '.join(f'{cell:<{widths[i]}}' for i, cell in enumerate(row[:3])) + '  ' + row[3])
    pill_e, pill_s = epoch.jobs.get('pill'), stock.jobs.get('pill')
    echo('')
    echo(f'  {"":<30} {"rq-epoch":>10} {"stock RQ":>10}')
    echo(f'  {"healthy jobs failed":<30} {epoch.healthy_failed:>10} {stock.healthy_failed:>10}')
    echo(f'  {"retries spent":<30} {epoch.retries_spent:>10} {stock.retries_spent:>10}')
    if pill_e and pill_s:
        echo(f'  {"workers the pill took down":<30} {pill_e.runs:>10} {pill_s.runs:>10}')
        echo(
            f'  poison pill, rq-epoch: {epoch.outcome(pill_e)}: StalledJobError once its stall budget '
            f'(max_stalled={MAX_STALLED}) was spent under a live server'
        )
        echo(
            f'  poison pill, stock RQ: {stock.outcome(pill_s)}: the same fate as h1, a healthy job '
            'whose machine was lost'
        )
