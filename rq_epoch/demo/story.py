"""One play of the demo's story, by one kind of worker: its workers, its clock and its acts.

The story, with real ``rq worker`` processes on a real server:

1. a worker machine is lost (its worker and work-horse are SIGKILLed) while it runs a job;
2. a poison pill: a job that takes down every worker that runs it;
3. the server restarts while jobs run, and the machine of one of the workers is lost
   while the server is down.

The demo plays supervisor (a worker that dies is replaced, as systemd would) and cron (the
sweep runs every half second, so every verdict shows as it happens).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import redis
from rq import Retry
from rq.job import Job as RQJob
from rq.queue import Queue as RQQueue

from ..compat import text as _text
from ..jobs.queue import Queue
from ..protocol import keys
from ..protocol.server import read_epoch
from ..settings import EpochSettings
from ..sweep.sweeper import Sweeper
from .common import (
    DOWNTIME,
    HEARTBEAT,
    LEASE_MARGIN,
    MAX_STALLED,
    PILL,
    RESTART_GRACE,
    STOCK_WORKER,
    SWEEP_EVERY,
    TICK,
    WORK,
    DemoError,
)
from .common import short as _short
from .ledger import DemoJob, Ledger
from .processes import WorkerSlot

if TYPE_CHECKING:
    from .runner import Demo


class Story(Ledger):
    """One play of the story, by one kind of worker."""

    def __init__(self, demo: Demo, kind: str) -> None:
        """Set up the story's queue (and, for rq-epoch, its sweeper) on the demo's server."""
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

    # -- workers

    def start_worker(self, replacing: str | None = None) -> WorkerSlot:
        """Start one more worker of this story's kind (in place of ``replacing``, when given)."""
        self.worker_count += 1
        short = f'{self.letter}{self.worker_count}'
        name = f'{self.demo.prefix}-{short}'
        proc = self.demo.processes.start_worker(
            name, self.queue_name, epoch=self.epoch, url=self.demo.url, log=self.demo.folder / f'worker-{short}.log'
        )
        slot = WorkerSlot(short, proc)
        self.workers.append(slot)
        if replacing:
            self.say(f'supervisor: worker {replacing} is gone; started {short} (pid {proc.pid}) in its place')
        return slot

    def slot_of(self, worker_name: str) -> WorkerSlot | None:
        """The slot of the worker named ``worker_name``, while it runs."""
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

    def supervise(self) -> None:
        """Notice workers that ended, tell why, and start their replacements (as systemd would)."""
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
        """Enqueue one job of the story, by dotted path, with its tag and the job log."""
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
        """Tell a job's new status."""
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

    # -- time

    def tick(self) -> None:
        """One step of the clock: sweep, observe, supervise."""
        if not self.server_down:
            try:
                self.sweep()
                self.observe()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
        self.supervise()

    def run_for(self, seconds: float) -> None:
        """Let the story run for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tick()
            time.sleep(TICK)

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Let the story run until ``condition`` holds; DemoError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            if not self.server_down and condition():
                return
            if time.monotonic() > deadline:
                raise DemoError(f'{self.label} story: {what} did not happen within {timeout:.0f}s')
            time.sleep(TICK)

    def settled(self, *tags: str) -> bool:
        """Whether every job of ``tags`` (all by default) has ended and no work-horse still runs it."""
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
        """Whether ``tag`` runs on a worker."""
        return self.jobs[tag].status == 'started' and bool(self.jobs[tag].worker)

    # -- the acts

    def play(self, restart: bool) -> None:
        """Play the acts, then stop the workers and collect what became of every job."""
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
                f'({STOCK_WORKER}), so that leases expire as fast as in story 1; '
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
        """Act 3: restart the server while jobs run, losing one worker machine during the outage."""
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
        """Stop every worker of the story (SIGTERM, then SIGKILL after a bounded wait)."""
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
