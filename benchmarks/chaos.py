"""Chaos run: stock RQ and rq-epoch under the same seeded faults, audited against a ledger.

``python -m benchmarks.chaos [options]`` runs, for each side (``stock``: ``rq worker``;
``rq-epoch``: ``rq worker --worker-class rq_epoch.Worker``), on a fresh server of its own:

* a real server (Valkey or redis-server) with AOF and ``appendfsync always``;
* a pool of real ``rq worker`` subprocesses kept alive by a supervisor, as systemd or a
  container runtime would: a worker that exits is started again after ``--respawn-delay``
  seconds, and whatever an exited worker left running (its work-horse) is ended, as a
  control-group kill or a container exit does; with ``--queues N`` every worker listens
  on N queues (``chaos``, ``chaos-2``, ...) and each job goes to one of them;
* a cron-like sweeper process (``python -m benchmarks.chaos sweeper``): rq-epoch's
  :class:`rq_epoch.Sweeper` on one side, stock ``StartedJobRegistry.cleanup()`` on the
  other, every ``--sweep-interval`` seconds; the workers' own maintenance runs as well
  (rq-epoch's sweep interval; stock ``--maintenance-interval`` set to the same value);
* a producer that enqueues the workload at its planned times: healthy jobs of mixed
  length, poison pills (each attempt SIGKILLs its worker and work-horse), ``on_failure``
  callbacks and ``allow_failure`` dependents;
* the fault schedule: server restarts (clean SHUTDOWN and ``kill -9``), SIGKILLs of a
  busy worker and its horse, and freezes (SIGSTOP of a busy worker and its horse for
  longer than the lease, then SIGCONT).

Workload and schedule come from ``--seed`` alone, so both sides get the same ones. Then
every job is audited against the ledger the jobs write outside Redis
(:mod:`benchmarks.chaos_jobs`), one table row per side, and rq-epoch's invariants are
checked; a violation prints the job's history and the exit status is 1.

Both sides use the same heartbeat (``--job-monitoring-interval``). Stock RQ adds 60 s to
every lease (its heartbeat TTL is the interval plus 60) and only notices a stall when its
cleanup runs after that; rq-epoch's lease is the heartbeat plus ``--lease-margin``.

Only loopback is used, only processes this run started are signalled, every wait is
bounded, and all processes and temp folders are removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
import rq
from rq import Callback, Retry
from rq.job import Dependency
from rq.job import Job as RQJob
from rq.queue import Queue as RQQueue

import rq_epoch
from rq_epoch import keys
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.failover import is_outage
from rq_epoch.pids import children_of, proc_stat, send_signal

ROOT = Path(__file__).resolve().parent.parent
QUEUE = 'chaos'
STOCK = 'stock'
EPOCH = 'rq-epoch'
SIDES = (STOCK, EPOCH)
#: Seconds stock RQ adds to every heartbeat TTL (``Worker.get_heartbeat_ttl``).
STOCK_LEASE_EXTRA = 60
WORK = 'benchmarks.chaos_jobs.work'
PILL = 'benchmarks.chaos_jobs.poison_pill'
ON_FAILURE = 'benchmarks.chaos_jobs.on_failure'
#: Kept long enough that no finished or failed job expires before the audit.
RESULT_TTL = 7 * 24 * 3600
#: Reasons a superseded execution may have on the rq-epoch side.
ALLOWED_REASONS = {'kill', 'freeze', 'poison pill'}
#: Seconds a kill or freeze may wait past its planned time for a worker that is running a job.
BUSY_WAIT = 10.0
#: Seconds after a promotion (or a frozen primary's thaw) during which an execution cut short is
#: attributed to the failover: the old primary stays a writable master until the sentinels
#: convert it, about 10 s later.
FAILOVER_TAIL = 15.0
_SERVER_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError)


# -- configuration and plan --------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Every parameter of a chaos run; the defaults are the documented run's."""

    jobs: int = 2000
    pills: int = 5
    workers: int = 8
    restarts: int = 20
    kills: int = 20
    freezes: int = 5
    duration: float = 300.0
    seed: int = 2024
    max_stalled: int = 3
    retries: int | None = None
    heartbeat: int = 1
    lease_margin: int = 2
    sweep_interval: int = 1
    restart_grace: int = 4
    min_seconds: float = 0.1
    max_seconds: float = 3.0
    callbacks: float = 0.1
    dependents: float = 0.1
    down_min: float = 1.0
    down_max: float = 3.0
    freeze_for: float | None = None
    drain: float | None = None
    server: str = 'valkey'
    sides: tuple[str, ...] = SIDES
    respawn_delay: float = 1.0
    queues: int = 1
    keep: bool = False
    workdir: str | None = None
    #: ``single`` (one server) or ``sentinel`` (a primary, ``replicas`` replicas, three sentinels).
    topology: str = 'single'
    replicas: int = 1
    #: Sentinel topology: manual failovers (``SENTINEL FAILOVER``) and frozen primaries.
    failovers: int = 0
    primary_freezes: int = 0
    #: Seconds a frozen primary stays stopped (the sentinels promote a replica meanwhile).
    primary_freeze_for: float = 8.0
    #: Sentinel topology: ``min-replicas-to-write`` on every server (0: off).
    min_replicas: int = 0

    @property
    def queue_names(self) -> tuple[str, ...]:
        """The queues every worker listens on: ``chaos``, then ``chaos-2``, ``chaos-3``..."""
        return (QUEUE, *(f'{QUEUE}-{i}' for i in range(2, self.queues + 1)))

    def queue_of(self, job_id: str) -> str:
        """The queue a job is enqueued on (from its id, so the seed's draws stay the same)."""
        names = self.queue_names
        return names[zlib.crc32(job_id.encode()) % len(names)]

    @property
    def retry_budget(self) -> int:
        """``Retry(max=N)`` given to every job: by default the attempts rq-epoch allows a stalled job."""
        return self.max_stalled - 1 if self.retries is None else self.retries

    def lease(self, side: str) -> float:
        """Seconds a lease lasts past a heartbeat on ``side``."""
        if side == STOCK:
            return float(self.heartbeat + STOCK_LEASE_EXTRA)
        return float(self.heartbeat + self.lease_margin)

    @property
    def freeze_seconds(self) -> float:
        """How long a freeze lasts: longer than the longest lease of the sides run, plus sweeps."""
        if self.freeze_for is not None:
            return self.freeze_for
        return max(self.lease(s) for s in self.sides) + 2 * self.sweep_interval + 3

    def drain_seconds(self, side: str) -> float:
        """Bound on the wait, after the last fault, for every job to end.

        Long enough for a poison pill enqueued late to use its whole budget: each of its
        ``max_stalled`` attempts costs one lease before a sweep sees it.
        """
        if self.drain is not None:
            return self.drain
        base = self.max_stalled * (self.lease(side) + 2 * self.sweep_interval) + self.max_seconds + 30
        if self.topology == 'sentinel':
            # Each failover can leave a backlog: with min-replicas-to-write, the new primary takes
            # no write until the old one has rejoined as its replica (10-20 s).
            base += 20 * (self.failovers + self.primary_freezes)
        return base

    def command(self) -> str:
        """The command line that reproduces this run."""
        argv = ['python', '-m', 'benchmarks.chaos']
        defaults = Config()
        for name, flag in _FLAGS.items():
            value = getattr(self, name)
            if name in ('keep', 'workdir'):
                continue
            if name == 'sides':
                if value != defaults.sides:
                    argv += ['--sides', ','.join(value)]
                continue
            if value != getattr(defaults, name) and value is not None:
                argv += [flag, str(value)]
        return shlex.join(argv)


_FLAGS = {
    'jobs': '--jobs',
    'pills': '--pills',
    'workers': '--workers',
    'restarts': '--restarts',
    'kills': '--kills',
    'freezes': '--freezes',
    'duration': '--duration',
    'seed': '--seed',
    'max_stalled': '--max-stalled',
    'retries': '--retries',
    'heartbeat': '--heartbeat',
    'lease_margin': '--lease-margin',
    'sweep_interval': '--sweep-interval',
    'restart_grace': '--restart-grace',
    'min_seconds': '--min-seconds',
    'max_seconds': '--max-seconds',
    'callbacks': '--callbacks',
    'dependents': '--dependents',
    'down_min': '--down-min',
    'down_max': '--down-max',
    'freeze_for': '--freeze-for',
    'drain': '--drain',
    'server': '--server',
    'sides': '--sides',
    'respawn_delay': '--respawn-delay',
    'queues': '--queues',
    'keep': '--keep',
    'workdir': '--workdir',
    'topology': '--topology',
    'replicas': '--replicas',
    'failovers': '--failovers',
    'primary_freezes': '--primary-freezes',
    'primary_freeze_for': '--primary-freeze-for',
    'min_replicas': '--min-replicas',
}


@dataclass(frozen=True)
class JobSpec:
    """One planned job."""

    id: str
    kind: str  # 'healthy' or 'pill'
    seconds: float
    at: float  # seconds after the start of the run
    callback: bool
    parent: str | None = None


@dataclass(frozen=True)
class FaultSpec:
    """One planned fault."""

    at: float
    # 'restart' (SHUTDOWN), 'crash' (kill -9 of the server), 'kill', 'freeze'; Sentinel topology:
    # 'failover' (SENTINEL FAILOVER), 'primary-freeze' (SIGSTOP of the primary, SIGCONT after ``hold``)
    kind: str
    slot: int  # the worker slot to start looking for a busy worker from
    hold: float  # seconds down (restarts) or frozen (freezes)


@dataclass(frozen=True)
class Plan:
    """The workload and the fault schedule, both drawn from the seed."""

    jobs: tuple[JobSpec, ...]
    faults: tuple[FaultSpec, ...]

    def by_id(self) -> dict[str, JobSpec]:
        """The planned jobs by id."""
        return {j.id: j for j in self.jobs}


def _draw_seconds(rng: random.Random, lo: float, hi: float) -> float:
    """Mostly short jobs, some medium, a few long: 60 % / 30 % / 10 %."""
    span = hi - lo
    r = rng.random()
    if r < 0.6:
        a, b = lo, lo + span * 0.15
    elif r < 0.9:
        a, b = lo + span * 0.15, lo + span * 0.5
    else:
        a, b = lo + span * 0.5, hi
    return round(rng.uniform(a, b), 2)


def make_plan(cfg: Config) -> Plan:
    """Draw the workload and the fault schedule from ``cfg.seed`` (nothing else)."""
    rng = random.Random(cfg.seed)
    window = cfg.duration
    times = sorted(round(rng.uniform(0.0, window * 0.85), 3) for _ in range(cfg.jobs))
    healthy: list[JobSpec] = []
    for i, at in enumerate(times):
        parent = None
        if i and rng.random() < cfg.dependents:
            parent = healthy[rng.randrange(max(0, i - 10), i)].id
        healthy.append(
            JobSpec(
                id=f'h{i:05d}',
                kind='healthy',
                seconds=_draw_seconds(rng, cfg.min_seconds, cfg.max_seconds),
                at=at,
                callback=rng.random() < cfg.callbacks,
                parent=parent,
            )
        )
    pills = [
        JobSpec(
            id=f'p{k:02d}',
            kind='pill',
            seconds=0.0,
            at=round(window * 0.5 * (k + 1) / (cfg.pills + 1), 3),
            callback=True,
        )
        for k in range(cfg.pills)
    ]
    # Each pill gets a dependent (allow_failure): the first healthy job enqueued after it
    # that has no parent yet.
    taken: set[int] = set()
    for pill in pills:
        for i, job in enumerate(healthy):
            if job.at >= pill.at and job.parent is None and i not in taken:
                healthy[i] = replace(job, parent=pill.id)
                taken.add(i)
                break
    jobs = sorted(healthy + pills, key=lambda j: (j.at, j.id))

    faults: list[FaultSpec] = []
    start, end = window * 0.1, window * 0.95
    if cfg.restarts:
        span = (end - start) / cfg.restarts
        for k in range(cfg.restarts):
            at = start + span * (k + 0.5) + rng.uniform(-0.25, 0.25) * span
            kind = 'restart' if k % 2 == 0 else 'crash'
            faults.append(FaultSpec(round(at, 3), kind, 0, round(rng.uniform(cfg.down_min, cfg.down_max), 2)))
    for _ in range(cfg.kills):
        faults.append(FaultSpec(round(rng.uniform(start, end), 3), 'kill', rng.randrange(cfg.workers), 0.0))
    for _ in range(cfg.freezes):
        faults.append(
            FaultSpec(round(rng.uniform(start, end), 3), 'freeze', rng.randrange(cfg.workers), cfg.freeze_seconds)
        )
    # Drawn last, so that a plan without them is the same as before they existed. Spread
    # evenly (with jitter): each needs the topology settled again after the previous one.
    topology_faults = ['failover'] * cfg.failovers + ['primary-freeze'] * cfg.primary_freezes
    rng.shuffle(topology_faults)
    if topology_faults:
        span = (end - start) / len(topology_faults)
        for k, kind in enumerate(topology_faults):
            at = start + span * (k + 0.5) + rng.uniform(-0.2, 0.2) * span
            hold = cfg.primary_freeze_for if kind == 'primary-freeze' else 0.0
            faults.append(FaultSpec(round(at, 3), kind, 0, hold))
    faults.sort(key=lambda f: (f.at, f.kind))
    return Plan(tuple(jobs), tuple(faults))


# -- processes ---------------------------------------------------------------------------


def _become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), so none escapes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


class Recorder:
    """The run's event log (faults, worker exits, server restarts), with times."""

    def __init__(self, path: Path, t0: float) -> None:
        """Append events to ``path``; ``t0`` is the start of the run (for relative times)."""
        self.path = path
        self.t0 = t0
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, **data: Any) -> dict[str, Any]:
        """Record one event, with its time, in memory and in the events file."""
        event = {'t': round(time.time(), 3), 'rel': round(time.time() - self.t0, 2), 'kind': kind, **data}
        with self._lock:
            self.events.append(event)
            with open(self.path, 'a', encoding='utf-8') as fh:
                fh.write(json.dumps(event) + '\n')
        return event


@dataclass
class Slot:
    """One worker slot of the supervisor."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    horses: dict[int, int] = field(default_factory=dict)
    frozen: list[tuple[int, int]] = field(default_factory=list)
    killed_by_harness: bool = False
    respawn_at: float = 0.0

    @property
    def alive(self) -> bool:
        """Whether the slot has a worker process that has not exited."""
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Keeps ``n`` real ``rq worker`` processes running; ends what exited workers leave."""

    def __init__(
        self, side: str, cfg: Config, connection: list[str], folder: Path, recorder: Recorder, reaper: bool
    ) -> None:
        """Slots for ``cfg.workers`` workers of ``side``; ``connection`` is their connection options
        (``--url URL``, or ``-c MODULE -P DIR`` for a settings module with RQ's ``SENTINEL`` dict);
        logs go to ``folder``."""
        self.side = side
        self.cfg = cfg
        self.connection = connection
        self.folder = folder
        self.recorder = recorder
        self.reaper = reaper
        self.slots = [Slot(i) for i in range(cfg.workers)]
        self.managed: set[int] = set()
        self.baseline = set(children_of('self'))
        self.stopping = False
        self.env = dict(os.environ)
        self.env['PYTHONPATH'] = str(ROOT) + os.pathsep + self.env.get('PYTHONPATH', '')
        self.env['PYTHONUNBUFFERED'] = '1'
        self.env.update(epoch_environment(cfg))

    def argv(self) -> list[str]:
        """The ``rq worker`` command line of this side."""
        argv = [sys.executable, '-m', 'rq.cli', 'worker', *self.connection]
        argv += ['--job-monitoring-interval', str(self.cfg.heartbeat)]
        if self.side == EPOCH:
            argv += ['--worker-class', 'rq_epoch.Worker']
        else:
            argv += ['--maintenance-interval', str(self.cfg.sweep_interval)]
        return argv + list(self.cfg.queue_names)

    def start(self, slot: Slot) -> None:
        """Start a new worker process in ``slot`` (its log: ``worker-<slot>-<generation>.log``)."""
        slot.generation += 1
        log = self.folder / f'worker-{slot.index}-{slot.generation}.log'
        with open(log, 'wb') as fh:
            slot.proc = subprocess.Popen(
                self.argv(),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=self.env,
                start_new_session=True,
            )
        self.managed.add(slot.proc.pid)
        slot.horses = {}
        slot.frozen = []
        slot.killed_by_harness = False
        self.recorder.add('worker-start', slot=slot.index, pid=slot.proc.pid, log=log.name)

    def start_all(self) -> None:
        """Start a worker in every slot."""
        for slot in self.slots:
            self.start(slot)

    def horses_of(self, slot: Slot) -> dict[int, int]:
        """Current work-horses of a slot's worker, with their start times."""
        found: dict[int, int] = {}
        if slot.alive:
            assert slot.proc is not None
            for pid in children_of(slot.proc.pid):
                stat = proc_stat(pid)
                if stat is not None and stat[0] != 'Z':
                    found[pid] = stat[1]
        return found

    def tick(self) -> None:
        """Notice exits, end leftovers, start replacements, reap orphans."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None:
                if not self.stopping and now >= slot.respawn_at:
                    self.start(slot)
                continue
            code = slot.proc.poll()
            if code is None:
                if not slot.frozen:
                    slot.horses.update(self.horses_of(slot))
                continue
            cause = 'harness kill' if slot.killed_by_harness else ('signal' if code < 0 else 'exit')
            left = [pid for pid, started in slot.horses.items() if send_signal(pid, signal.SIGKILL, started)]
            self.recorder.add(
                'worker-exit', slot=slot.index, pid=slot.proc.pid, returncode=code, cause=cause, ended_leftovers=left
            )
            slot.proc = None
            slot.horses = {}
            slot.frozen = []
            slot.respawn_at = now + self.cfg.respawn_delay
        self.reap()

    def reap(self) -> None:
        """End and reap orphaned descendants handed to this process (as their subreaper)."""
        if not self.reaper:
            return
        for pid in children_of('self'):
            if pid in self.managed or pid in self.baseline:
                continue
            stat = proc_stat(pid)
            if stat is not None and stat[0] != 'Z':
                send_signal(pid, signal.SIGCONT)
                send_signal(pid, signal.SIGKILL)
                self.recorder.add('orphan-ended', pid=pid)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def pick(self, hint: int, busy: bool) -> Slot | None:
        """The first busy, unfrozen worker from slot ``hint`` on; without ``busy``, else a live one."""
        n = len(self.slots)
        order = [self.slots[(hint + i) % n] for i in range(n)]
        for slot in order:
            if slot.alive and not slot.frozen and self.horses_of(slot):
                return slot
        if busy:
            return None
        for slot in order:
            if slot.alive and not slot.frozen:
                return slot
        return None

    def kill(self, slot: Slot) -> dict[str, Any]:
        """SIGKILL a worker and its work-horse (a machine or container lost)."""
        assert slot.proc is not None
        horses = self.horses_of(slot)
        slot.killed_by_harness = True
        send_signal(slot.proc.pid, signal.SIGKILL)
        for pid, started in horses.items():
            send_signal(pid, signal.SIGKILL, started)
        return {'slot': slot.index, 'pid': slot.proc.pid, 'horses': sorted(horses)}

    def freeze(self, slot: Slot) -> dict[str, Any]:
        """SIGSTOP a worker and its work-horse (a frozen VM or container)."""
        assert slot.proc is not None
        horses = self.horses_of(slot)
        started = proc_stat(slot.proc.pid)
        slot.frozen = [(slot.proc.pid, started[1] if started else 0)] + list(horses.items())
        for pid, start in slot.frozen:
            send_signal(pid, signal.SIGSTOP, start)
        return {'slot': slot.index, 'pid': slot.proc.pid, 'horses': sorted(horses)}

    def thaw(self, slot: Slot, pid: int) -> bool:
        """SIGCONT what :meth:`freeze` stopped, if that worker is still the slot's."""
        if slot.proc is None or slot.proc.pid != pid or not slot.frozen:
            return False
        for p, start in slot.frozen:
            send_signal(p, signal.SIGCONT, start)
        slot.frozen = []
        return True

    def stop_all(self) -> None:
        """End every worker and work-horse of this run (bounded waits)."""
        self.stopping = True
        for slot in self.slots:
            for pid, start in slot.frozen:
                send_signal(pid, signal.SIGCONT, start)
            if slot.proc is not None and slot.proc.poll() is None:
                horses = self.horses_of(slot)
                send_signal(slot.proc.pid, signal.SIGKILL)
                for pid, start in {**slot.horses, **horses}.items():
                    send_signal(pid, signal.SIGKILL, start)
                try:
                    slot.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self.reap()


def epoch_environment(cfg: Config) -> dict[str, str]:
    """The ``RQ_EPOCH_*`` settings given to rq-epoch's workers and sweeper."""
    return {
        'RQ_EPOCH_MAX_STALLED': str(cfg.max_stalled),
        'RQ_EPOCH_HEARTBEAT_INTERVAL': str(cfg.heartbeat),
        'RQ_EPOCH_LEASE_MARGIN': str(cfg.lease_margin),
        'RQ_EPOCH_SWEEP_INTERVAL': str(cfg.sweep_interval),
        'RQ_EPOCH_RESTART_GRACE': str(cfg.restart_grace),
    }


# -- one side ----------------------------------------------------------------------------


class Producer(threading.Thread):
    """Enqueues the planned jobs at their times, riding out server outages."""

    def __init__(
        self, side: str, cfg: Config, plan: Plan, connect: Callable[[], redis.Redis], ledger: Path, t0: float
    ) -> None:
        """A producer for ``side`` that enqueues ``plan`` through ``connect()``, timed from ``t0``.

        Under Sentinel ``connect`` asks the sentinels: a new connection is made for every job,
        as a short-lived producer would, so that no job is enqueued on a demoted primary.
        """
        super().__init__(name=f'producer-{side}', daemon=True)
        self.side = side
        self.cfg = cfg
        self.plan = plan
        self.connect = connect
        self.ledger = ledger
        self.t0 = t0
        self.stop = threading.Event()
        #: Cleared by the harness while a manual failover is under way: the producer stands for
        #: clients that are not under test, and a job enqueued on the old primary in the instant
        #: after the promotion would be lost with every other write there.
        self.calm = threading.Event()
        self.calm.set()
        self.enqueued: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        """Enqueue every planned job at its time (stops early when :attr:`stop` is set)."""
        queue_class = rq_epoch.Queue if self.side == EPOCH else RQQueue
        fresh = self.cfg.topology == 'sentinel'
        client = self.connect()
        try:
            for spec in self.plan.jobs:
                delay = self.t0 + spec.at - time.time()
                if delay > 0 and self.stop.wait(delay):
                    return
                if self.stop.is_set():
                    return
                self.calm.wait(60)
                if fresh:
                    client.close()
                    client = self.connect()
                self._enqueue(queue_class(self.cfg.queue_of(spec.id), connection=client), client, spec)
        finally:
            client.close()

    def _enqueue(self, queue: Any, client: redis.Redis, spec: JobSpec) -> None:
        """Enqueue one job; after a connection error, check whether it landed before trying again."""
        kwargs: dict[str, Any] = {
            'job_id': spec.id,
            'result_ttl': RESULT_TTL,
            'failure_ttl': RESULT_TTL,
            'timeout': 180,
        }
        if self.cfg.retry_budget:
            kwargs['retry'] = Retry(max=self.cfg.retry_budget)
        if spec.callback:
            kwargs['on_failure'] = Callback(ON_FAILURE)
        if spec.parent:
            kwargs['depends_on'] = Dependency(jobs=[spec.parent], allow_failure=True)
        args: tuple[Any, ...]
        if spec.kind == 'pill':
            func, args = PILL, (str(self.ledger), spec.id)
            if self.side == EPOCH:
                kwargs['max_stalled'] = self.cfg.max_stalled
        else:
            func, args = WORK, (str(self.ledger), spec.id, spec.seconds)
        deadline = time.monotonic() + 120
        attempt = 0
        while not self.stop.is_set():
            try:
                if attempt and client.exists(keys.job_key(spec.id)):
                    break  # the enqueue (one transaction) landed before the connection dropped
                queue.enqueue_call(func, args=args, **kwargs)
                break
            except (*_SERVER_ERRORS, redis.exceptions.ResponseError) as exc:
                if isinstance(exc, redis.exceptions.ResponseError) and not is_outage(exc):
                    raise  # NOREPLICAS, READONLY...: the server cannot take writes now; anything else is a bug
                attempt += 1
                if time.monotonic() > deadline:
                    self.errors.append(f'{spec.id}: server unreachable for 120 s, not enqueued')
                    return
                time.sleep(0.2)
        self.enqueued.append(spec.id)


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

    @property
    def stale_outcomes(self) -> int:
        """Outcomes that landed from an execution other than the one that ended the job."""
        return max(0, self.worker_results - (1 if self.state == 'finished' else 0))

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
                1 for e in self.events if e['kind'] == 'worker-exit' and e['cause'] != 'harness kill'
            ),
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


class SideRun:
    """One side of the chaos run: its server, workers, sweeper, producer and faults."""

    def __init__(self, side: str, cfg: Config, plan: Plan, folder: Path, reaper: bool) -> None:
        """One side of ``plan``; its files (data, ledger, logs, events) go to ``folder``."""
        self.side = side
        self.cfg = cfg
        self.plan = plan
        self.folder = folder
        self.reaper = reaper
        folder.mkdir(parents=True, exist_ok=True)
        self.ledger = folder / 'ledger.log'
        (folder / 'data').mkdir(exist_ok=True)  # EmbeddedServer expects the folder to exist
        self.server = EmbeddedServer(cfg.server, data_dir=folder / 'data', appendfsync='always')
        self.topology: Any = None
        if cfg.topology == 'sentinel':
            from tests.sentinel import SentinelTopology

            guard = {'min-replicas-to-write': str(cfg.min_replicas), 'min-replicas-max-lag': '10'}
            self.topology = SentinelTopology(
                folder / 'topology',
                cfg.server,
                down_after_ms=1000,
                replicas=cfg.replicas,
                appendfsync='always',
                primary_config=guard if cfg.min_replicas else None,
                replica_config=guard if cfg.min_replicas else None,
            )
            self.server = self.topology.primary
        self.topology_busy_until = 0.0
        self.failover_attempts: Counter[int] = Counter()
        self.server_up = False
        self.recorder = Recorder(folder / 'events.jsonl', time.time())
        self.supervisor: Supervisor | None = None
        self.sweeper: subprocess.Popen[bytes] | None = None
        self.producer: Producer | None = None
        self.t0 = time.time()

    # -- running ---------------------------------------------------------------------

    def run(self) -> SideResult:
        """Start everything, inject the faults, drain, stop the processes, audit; always clean up."""
        started = time.monotonic()
        try:
            if self.topology is not None:
                self.topology.start()
                connection = ['-c', self.topology.settings_module(self.folder / 'settings', socket_timeout=5)]
                connection += ['-P', str(self.folder / 'settings')]
            else:
                self.server.start()
                connection = ['--url', self.server.url]
            self.server_up = True
            self.recorder.add('server-start', run_id=self.server.run_id(), pid=self.server.pid)
            self.supervisor = Supervisor(self.side, self.cfg, connection, self.folder, self.recorder, self.reaper)
            self.supervisor.managed.add(self.server.pid or 0)
            if self.topology is not None:
                self.supervisor.managed.update(self.topology.pids)
            self.supervisor.start_all()
            self.sweeper = self._start_sweeper()
            t0 = time.time()
            self.t0 = t0
            self.recorder.t0 = t0
            self.producer = Producer(self.side, self.cfg, self.plan, self.client, self.ledger, t0)
            self.producer.start()
            self._inject(t0)
            self._drain()
            wall = time.monotonic() - started
            self._stop_processes()
            return audit(self, wall)
        finally:
            self.close()

    def _start_sweeper(self) -> subprocess.Popen[bytes]:
        """Start the cron-like sweeper process of this side."""
        env = dict(os.environ)
        env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
        env.update(epoch_environment(self.cfg))
        if self.topology is not None:
            where = ['--sentinel', ','.join(f'{h}:{p}' for h, p in self.topology.instances)]
        else:
            where = ['--url', self.server.url]
        argv = [
            sys.executable,
            '-m',
            'benchmarks.chaos',
            'sweeper',
            *where,
            '--side',
            self.side,
            '--interval',
            str(self.cfg.sweep_interval),
            *[arg for name in self.cfg.queue_names for arg in ('--queue', name)],
            '--out',
            str(self.folder / 'sweeper.jsonl'),
            '--limit',
            str(int(self.cfg.duration + self.cfg.freeze_seconds + 3 * self.cfg.drain_seconds(self.side) + 600)),
        ]
        with open(self.folder / 'sweeper.log', 'wb') as fh:
            proc = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        assert self.supervisor is not None
        self.supervisor.managed.add(proc.pid)
        return proc

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client to the primary: the server, or under Sentinel whichever the sentinels name."""
        options = {'socket_timeout': 5, 'socket_connect_timeout': 1, **kwargs}
        if self.topology is None:
            return self.server.client(**options)
        from tests.sentinel import MASTER_NAME

        return self.topology.sentinel().master_for(MASTER_NAME, **options)

    def _topology_fault(self, fault: FaultSpec) -> tuple[float, str, Any] | None:
        """A failover or a frozen primary, once the topology has settled from the last one."""
        topology = self.topology
        if topology is None:
            raise ValueError(f'{fault.kind} needs --topology sentinel')
        key = id(fault)
        if time.time() < self.topology_busy_until or not topology.ready():
            self.failover_attempts[key] += 1
            if self.failover_attempts[key] > 120:
                self.recorder.add('fault-skipped', fault=fault.kind, planned=fault.at, why='topology never settled')
                return None
            return (time.time() + 0.5, 'fault', fault)
        old = topology.current_primary()
        old_run_id = old.run_id()
        if fault.kind == 'failover':
            self.recorder.add('failover', planned=fault.at, run_id=old_run_id, port=old.port)
            assert self.producer is not None
            self.producer.calm.clear()
            try:
                old, new = topology.failover(timeout=30)
            except (redis.exceptions.ResponseError, TimeoutError) as exc:  # e.g. NOGOODSLAVE: try again soon
                self.recorder.add('failover-refused', error=str(exc))
                self.failover_attempts[key] += 1
                return (time.time() + 1.0, 'fault', fault) if self.failover_attempts[key] <= 20 else None
            finally:
                self.producer.calm.set()
            self.recorder.add('promoted', run_id=new.run_id(), port=new.port, old_port=old.port)
            self.topology_busy_until = time.time() + 2.0
            return None
        frozen_at = time.time()
        self.recorder.add('primary-freeze', planned=fault.at, run_id=old_run_id, port=old.port, pid=old.pid)
        old, new = topology.freeze_until_promoted(timeout=60)
        self.recorder.add('promoted', run_id=new.run_id(), port=new.port, old_port=old.port)
        self.topology_busy_until = float('inf')
        return (max(time.time(), frozen_at + fault.hold), 'primary-thaw', old)

    def _inject(self, t0: float) -> None:
        """Run the fault schedule; supervise the workers meanwhile."""
        assert self.supervisor is not None and self.producer is not None
        events: list[tuple[float, int, str, Any]] = []
        for i, fault in enumerate(self.plan.faults):
            heapq.heappush(events, (t0 + fault.at, i, 'fault', fault))
        seq = len(events)
        bound = t0 + self.cfg.duration + self.cfg.freeze_seconds + 3 * self.cfg.down_max + 120
        while (events or self.producer.is_alive()) and time.time() < bound:
            self.supervisor.tick()
            while events and events[0][0] <= time.time():
                _, _, what, payload = heapq.heappop(events)
                follow = self._apply(what, payload)
                if follow is not None:
                    seq += 1
                    heapq.heappush(events, (follow[0], seq, follow[1], follow[2]))
            time.sleep(0.05)
        if events:
            self.recorder.add('schedule-unfinished', left=len(events))
        self.producer.stop.set()
        self.producer.join(10)

    def _apply(self, what: str, payload: Any) -> tuple[float, str, Any] | None:
        """Apply one event; return a follow-up event (time, kind, payload) if any."""
        assert self.supervisor is not None
        if what == 'fault':
            fault: FaultSpec = payload
            if fault.kind in ('failover', 'primary-freeze'):
                return self._topology_fault(fault)
            if fault.kind in ('restart', 'crash'):
                if not self.server_up:
                    return (time.time() + 0.5, 'fault', fault)  # never two outages at once
                before = _run_id(self.server)
                self.recorder.add('server-down', crash=fault.kind == 'crash', run_id=before, planned=fault.at)
                if fault.kind == 'crash':
                    self.server.kill(signal.SIGKILL)
                else:
                    self.server.stop()  # SHUTDOWN: the AOF is written
                self.server_up = False
                return (time.time() + fault.hold, 'server-up', fault)
            slot = self.supervisor.pick(fault.slot, busy=time.time() < self.t0 + fault.at + BUSY_WAIT)
            if slot is None:
                if time.time() < self.t0 + fault.at + BUSY_WAIT:
                    return (time.time() + 0.2, 'fault', fault)  # wait a little for a busy worker
                self.recorder.add('fault-skipped', fault=fault.kind, planned=fault.at)
                return None
            if fault.kind == 'kill':
                self.recorder.add('kill', planned=fault.at, **self.supervisor.kill(slot))
                return None
            info = self.supervisor.freeze(slot)
            self.recorder.add('freeze', planned=fault.at, hold=fault.hold, **info)
            return (time.time() + fault.hold, 'thaw', (slot, info['pid']))
        if what == 'server-up':
            self.server.start(timeout=60)
            self.supervisor.managed.add(self.server.pid or 0)
            self.server_up = True
            self.recorder.add('server-up', run_id=_run_id(self.server), pid=self.server.pid)
            return None
        if what == 'thaw':
            slot, pid = payload
            self.recorder.add('thaw', slot=slot.index, pid=pid, resumed=self.supervisor.thaw(slot, pid))
            return None
        if what == 'primary-thaw':
            self.topology.thaw(payload)
            self.recorder.add('primary-thaw', port=payload.port, pid=payload.pid)
            self.topology_busy_until = time.time() + 2.0
            return None
        raise ValueError(what)

    def _drain(self) -> None:
        """Wait, bounded, until every job has ended (or only dead-ends are left)."""
        assert self.supervisor is not None
        client = self.client()
        ids = [j.id for j in self.plan.jobs]
        parents = {j.id: j.parent for j in self.plan.jobs}
        deadline = time.monotonic() + self.cfg.drain_seconds(self.side)
        stuck_since: float | None = None
        try:
            while time.monotonic() < deadline:
                self.supervisor.tick()
                try:
                    with client.pipeline(transaction=False) as pipe:
                        for job_id in ids:
                            pipe.hget(keys.job_key(job_id), 'status')
                        statuses = {i: (s.decode() if s else '') for i, s in zip(ids, pipe.execute(), strict=True)}
                except _SERVER_ERRORS:
                    time.sleep(0.5)
                    continue
                open_jobs = [i for i, s in statuses.items() if s not in ('finished', 'failed')]
                if not open_jobs:
                    self.recorder.add('drained')
                    return
                # A dependent still deferred after its parent ended will never move.
                dead_ends = all(
                    statuses[i] == 'deferred'
                    and parents[i]
                    and statuses.get(parents[i] or '') in ('finished', 'failed')
                    for i in open_jobs
                )
                if dead_ends:
                    stuck_since = stuck_since or time.monotonic()
                    if time.monotonic() - stuck_since > 10:
                        self.recorder.add('drain-dead-ends', jobs=open_jobs)
                        return
                else:
                    stuck_since = None
                time.sleep(0.5)
            self.recorder.add('drain-deadline')
        finally:
            client.close()

    def _stop_processes(self) -> None:
        """Stop the producer, the sweeper and every worker (bounded waits)."""
        if self.producer is not None:
            self.producer.stop.set()
        if self.sweeper is not None and self.sweeper.poll() is None:
            self.sweeper.send_signal(signal.SIGTERM)
            try:
                self.sweeper.wait(10)
            except subprocess.TimeoutExpired:
                self.sweeper.kill()
                self.sweeper.wait(5)
        if self.supervisor is not None:
            self.supervisor.stop_all()

    def close(self) -> None:
        """End every process of this side and stop the server (idempotent)."""
        try:
            self._stop_processes()
        finally:
            if self.topology is not None:
                self.topology.close()
            else:
                self.server.close()


def _run_id(server: EmbeddedServer) -> str:
    """The server's run_id, or "" while it is unreachable."""
    try:
        return server.run_id()
    except _SERVER_ERRORS:
        return ''


# -- audit -------------------------------------------------------------------------------


def read_ledger(path: Path) -> tuple[dict[str, list[Attempt]], Counter[str], dict[str, list[str]]]:
    """Attempts per job, callbacks per job, and each job's raw ledger lines."""
    attempts: dict[str, dict[int, Attempt]] = {}
    callbacks: Counter[str] = Counter()
    lines: dict[str, list[str]] = {}
    if not path.exists():
        return {}, callbacks, lines
    for line in path.read_text(encoding='utf-8', errors='replace').splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        event, job_id, n, pid, ppid, t = parts[:6]
        lines.setdefault(job_id, []).append(line)
        if event == 'callback':
            callbacks[job_id] += 1
        elif event == 'start':
            attempts.setdefault(job_id, {})[int(n)] = Attempt(int(n), int(pid), int(ppid), float(t))
        elif event == 'end' and int(n) in attempts.get(job_id, {}):
            attempts[job_id][int(n)].end = float(t)
    ordered = {job_id: sorted(a.values(), key=lambda x: x.start) for job_id, a in attempts.items()}
    return ordered, callbacks, lines


def explain(attempt: Attempt, following: float | None, pill: bool, events: list[dict[str, Any]]) -> str:
    """Why an execution was followed by another one: the fault that hit it, if any.

    A kill or freeze hit the execution when its work-horse was among the processes
    signalled (else, when the horse was not seen, when its worker was signalled while the
    execution ran); the earliest such fault is the reason.
    """
    if pill:
        return 'poison pill'
    until = attempt.end + 2.0 if attempt.end is not None else (following if following is not None else float('inf'))
    faults = [e for e in events if e['kind'] in ('kill', 'freeze')]
    hit = [e for e in faults if attempt.pid in e.get('horses', [])]
    if not hit:
        hit = [
            e for e in faults
            if e.get('pid') == attempt.ppid and not e.get('horses') and attempt.start - 0.05 <= e['t'] <= until
        ]  # fmt: skip
    if hit:
        return str(min(hit, key=lambda e: e['t'])['kind'])
    outages = _outages(events)
    in_outage = any(down <= until and up + 5 >= attempt.start for down, up in outages)
    in_failover = any(start <= until and end + FAILOVER_TAIL >= attempt.start for start, end in _failovers(events))
    own_exit = [
        e for e in events
        if e['kind'] == 'worker-exit' and e.get('pid') == attempt.ppid and e['cause'] != 'harness kill'
        and attempt.start - 0.05 <= e['t'] <= until
    ]  # fmt: skip
    if own_exit:
        return 'restart' if in_outage else ('failover' if in_failover else 'worker exit')
    if in_failover:  # also two executions at once: one of them took the job from the old primary
        return 'failover'
    if following is not None and attempt.end is not None and following < attempt.end:
        return 'ran twice at once'
    if in_outage:
        return 'restart'
    return 'unexplained'


def _failovers(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Failovers and frozen primaries from the event log, as (start, promoted or thawed) times."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    frozen = False
    for e in events:
        kind = e['kind']
        if kind in ('failover', 'primary-freeze'):
            start, frozen = e['t'], kind == 'primary-freeze'
        elif kind == 'failover-refused':
            start = None
        elif start is not None and ((kind == 'promoted' and not frozen) or kind == 'primary-thaw'):
            out.append((start, e['t']))
            start = None
    if start is not None:
        out.append((start, float('inf')))
    return out


def _outages(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Server outages from the event log, as (down, up) times."""
    out: list[tuple[float, float]] = []
    down: float | None = None
    for e in events:
        if e['kind'] == 'server-down':
            down = e['t']
        elif e['kind'] == 'server-up' and down is not None:
            out.append((down, e['t']))
            down = None
    if down is not None:
        out.append((down, float('inf')))
    return out


def _text(value: Any) -> str:
    """A Redis reply as text ("" for None)."""
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else ('' if value is None else str(value))


def audit(run: SideRun, wall: float) -> SideResult:
    """Audit every job of a side against the ledger; check rq-epoch's invariants."""
    cfg, plan, side = run.cfg, run.plan, run.side
    client = run.client(socket_timeout=30)
    try:
        return _audit(client, run, cfg, plan, side, wall)
    finally:
        client.close()


def _audit(client: redis.Redis, run: SideRun, cfg: Config, plan: Plan, side: str, wall: float) -> SideResult:
    """Read the final state of every job and attribute its executions."""
    attempts, callbacks, ledger_lines = read_ledger(run.ledger)
    events = run.recorder.events
    queued: set[str] = set()
    intermediate: set[str] = set()
    wip: set[str] = set()
    leases: set[str] = set()
    deferred: set[str] = set()
    ready: set[str] = set()
    scheduled: set[str] = set()
    failed_reg: set[str] = set()
    finished_reg: set[str] = set()
    for name in cfg.queue_names:
        queue = RQQueue(name, connection=client)
        queued |= {_text(x) for x in client.lrange(queue.key, 0, -1)}
        intermediate |= {_text(x) for x in client.lrange(keys.intermediate_key(name), 0, -1)}
        wip |= {_text(x).split(':', 1)[0] for x in client.zrange(keys.wip_key(name), 0, -1)}
        leases |= {_text(x).split(':', 1)[0] for x in client.zrange(keys.leases_key(name), 0, -1)}
        deferred |= {_text(x) for x in client.zrange(keys.registry_key('deferred', name), 0, -1)}
        ready |= {_text(x) for x in client.zrange(keys.registry_key('ready', name), 0, -1)}  # RQ 3
        scheduled |= {_text(x) for x in client.zrange(keys.registry_key('scheduled', name), 0, -1)}
        failed_reg |= {_text(x) for x in client.zrange(keys.failed_key(name), 0, -1)}
        finished_reg |= {_text(x) for x in client.zrange(keys.registry_key('finished', name), 0, -1)}
    job_class = rq_epoch.Job if side == EPOCH else RQJob
    jobs: list[JobAudit] = []
    for spec in plan.jobs:
        raw = {_text(k): _text(v) for k, v in client.hgetall(keys.job_key(spec.id)).items()}
        status = raw.get('status', '')
        where = ','.join(
            name
            for name, members in (
                ('queue', queued),
                ('intermediate', intermediate),
                ('started', wip),
                ('lease', leases),
                ('deferred', deferred),
                ('ready', ready),
                ('scheduled', scheduled),
                ('failed', failed_reg),
                ('finished', finished_reg),
            )
            if spec.id in members
        )
        results, worker_results, failure = 0, 0, ''
        if raw:
            try:
                job = job_class.fetch(spec.id, connection=client)
                found = job.results()
                results = len(found)
                worker_results = sum(1 for r in found if getattr(r, 'worker_name', ''))
                latest = found[0] if found else None
                if status == 'failed':
                    failure = _text(getattr(latest, 'exc_string', '') or job.exc_info or '').strip()
                    failure = failure.splitlines()[-1] if failure else ''
            except Exception as exc:  # noqa: BLE001 - the audit reports, it does not stop
                failure = f'(unreadable: {exc})'
        if status in ('finished', 'failed'):
            state = status
        elif not raw:
            state = 'lost'
        elif (
            spec.id in queued
            or spec.id in intermediate
            or spec.id in wip
            or spec.id in leases
            or spec.id in deferred
            or spec.id in ready
            or spec.id in scheduled
        ):
            state = 'stuck'
        else:
            state = 'lost'
        retries_left = raw.get('retries_left', '')
        spent = cfg.retry_budget - int(retries_left) if retries_left.lstrip('-').isdigit() and cfg.retry_budget else 0
        job_attempts = attempts.get(spec.id, [])
        for i, attempt in enumerate(job_attempts[:-1]):
            attempt.reason = explain(attempt, job_attempts[i + 1].start, spec.kind == 'pill', events)
        if job_attempts and state not in ('finished',):
            # What ended the last execution of a job that did not finish.
            job_attempts[-1].reason = explain(job_attempts[-1], None, spec.kind == 'pill', events)
        jobs.append(
            JobAudit(
                id=spec.id,
                kind=spec.kind,
                status=status or '(gone)',
                state=state,
                attempts=job_attempts,
                callbacks=callbacks.get(spec.id, 0),
                stalled=int(raw.get('stalled') or 0),
                exempt=int(raw.get('exempt_recoveries') or 0),
                retries_spent=max(0, spent),
                results=results,
                failure=failure,
                where=where,
                worker_results=worker_results,
            )
        )
    violations: list[str] = []
    histories: dict[str, list[str]] = {}
    notes: list[str] = []
    if run.producer is not None and run.producer.errors:
        notes += run.producer.errors
    if side == EPOCH:
        violations = check_invariants(jobs, cfg)
        for job_id in sorted({v.split(':', 1)[0] for v in violations}):
            histories[job_id] = job_history(job_id, client, run, jobs, ledger_lines, events)
    refused = sum(int(client.hget(keys.stats_key(name), 'refused') or 0) for name in cfg.queue_names)
    return SideResult(side, wall, jobs, events, violations, histories, notes, cfg.max_stalled, refused)


def check_invariants(jobs: Sequence[JobAudit], cfg: Config) -> list[str]:
    """rq-epoch's invariants; each violation is ``'<job id>: <what>'``."""
    out: list[str] = []
    allowed = ALLOWED_REASONS
    if cfg.topology == 'sentinel' and cfg.min_replicas < cfg.replicas:
        # Replication is asynchronous: a write the old primary took in the instant between the
        # promotion and the moment the sentinels name the new primary (an outcome, a grant) is
        # lost with every other write there, unless every replica had to acknowledge it. Such
        # a job may run again, but uncounted: the stall check below still applies.
        allowed = ALLOWED_REASONS | {'failover'}
    for job in jobs:
        if job.state in ('lost', 'stuck'):
            out.append(f'{job.id}: {job.state} (status {job.status}, in {job.where or "nothing"})')
        if job.kind == 'healthy' and job.state == 'failed':
            out.append(f'{job.id}: healthy job failed: {job.failure}')
        elif job.kind == 'healthy' and job.retries_spent:
            # A healthy job never raises: a spent retry is a failure the infrastructure caused.
            out.append(f'{job.id}: healthy job failed {job.retries_spent} time(s) and was retried')
        if job.kind == 'pill':
            if job.state != 'failed' or 'failed' not in job.where.split(','):
                out.append(f'{job.id}: poison pill not dead-lettered (status {job.status}, in {job.where})')
            elif job.stalled != cfg.max_stalled:
                out.append(f'{job.id}: poison pill dead after {job.stalled} counted stalls, not {cfg.max_stalled}')
            elif not cfg.max_stalled <= job.executions <= cfg.max_stalled + job.exempt:
                out.append(
                    f'{job.id}: poison pill ran {job.executions} times for {job.stalled} counted stalls and '
                    f'{job.exempt} uncounted recoveries'
                )
        for attempt in job.attempts[:-1]:
            if attempt.reason not in allowed:
                out.append(
                    f'{job.id}: ran again after execution {attempt.n} (worker {attempt.ppid}) without a kill or '
                    f'freeze of its worker ({attempt.reason})'
                )
        if job.stale_outcomes:
            out.append(f'{job.id}: {job.stale_outcomes} outcome(s) of a superseded execution landed')
        if job.kind == 'healthy':
            hits = sum(1 for a in job.attempts[:-1] if a.reason in ('kill', 'freeze'))
            if job.stalled > hits:
                out.append(f'{job.id}: {job.stalled} counted stall(s) but only {hits} kill/freeze of its workers')
    return out


def job_history(
    job_id: str,
    client: redis.Redis,
    run: SideRun,
    jobs: Sequence[JobAudit],
    ledger_lines: dict[str, list[str]],
    events: list[dict[str, Any]],
) -> list[str]:
    """Everything about one job: ledger, job hash, faults on its workers, sweeps, worker logs."""
    out: list[str] = []
    audit_row = next((j for j in jobs if j.id == job_id), None)
    if audit_row is not None:
        out.append(
            f'audit: state {audit_row.state}, status {audit_row.status}, in {audit_row.where}, '
            f'stalled {audit_row.stalled}, exempt {audit_row.exempt}, results {audit_row.results}'
        )
        for a in audit_row.attempts:
            out.append(f'  execution {a.n}: horse {a.pid} worker {a.ppid} start {a.start:.3f} end {a.end} {a.reason}')
    out += [f'ledger: {line}' for line in ledger_lines.get(job_id, [])]
    try:
        raw = client.hgetall(keys.job_key(job_id))
        fields = (
            'status',
            'origin',
            'stalled',
            'exempt_recoveries',
            'lease_epoch',
            'lease_execution',
            'stall_epochs',
            'retries_left',
            'worker_name',
            'started_at',
            'ended_at',
            'enqueued_at',
        )
        out.append('job hash: ' + ', '.join(f'{f}={_text(raw.get(f.encode()))}' for f in fields if f.encode() in raw))
    except _SERVER_ERRORS as exc:
        out.append(f'job hash: unreadable ({exc})')
    pids = {a.ppid for a in (audit_row.attempts if audit_row else [])}
    for e in events:
        if e.get('pid') in pids or e['kind'] in ('server-down', 'server-up'):
            out.append(f'event: +{e["rel"]}s {json.dumps({k: v for k, v in e.items() if k not in ("t", "rel")})}')
    sweeps = run.folder / 'sweeper.jsonl'
    if sweeps.exists():
        for line in sweeps.read_text(errors='replace').splitlines():
            if f'"{job_id}"' in line:
                out.append(f'cron sweeper: {line}')
    for log in sorted(run.folder.glob('worker-*.log')):
        for line in log.read_text(errors='replace').splitlines():
            if job_id in line:
                out.append(f'{log.name}: {line.strip()}')
    return out


# -- report ------------------------------------------------------------------------------


def _n(count: int, noun: str) -> str:
    """``1 kill``, ``2 kills``."""
    return f'{count} {noun}' + ('' if count == 1 else 's')


def _seconds(value: float) -> str:
    """Seconds for the table: "12 s", "3.4 s"."""
    return f'{value:.0f} s' if value >= 10 else f'{value:.1f} s'


def table(results: Sequence[SideResult], cfg: Config) -> str:
    """The audit table (markdown), one row per side, and a second one with the details."""
    head = (
        '| side | jobs finished | healthy jobs failed or dead-lettered | poison pills dead-lettered | lost | stuck '
        '| executions per job | retries spent | wall time |'
    )
    lines = [head, '|' + '---|' * 9]
    for result in results:
        r = result.row()
        why = ', '.join(f'{v} {k}' for k, v in sorted(r['healthy_failed_why'].items(), key=lambda kv: -kv[1]))
        failed = f'{r["healthy_failed"]}' + (f' ({why})' if why else '')
        if result.side == EPOCH:
            stalls = sorted(set(r['pill_stalls']))
            pills = f'{r["pills_dead"]}/{r["pills"]} (after {"/".join(map(str, stalls)) or "-"} counted stalls)'
        else:
            runs = sorted(set(r['pill_executions']))
            noun = 'execution' if runs == [1] else 'executions'
            pills = f'{r["pills_dead"]}/{r["pills"]} (after {"/".join(map(str, runs)) or "-"} {noun}; no stall count)'
        reasons = ', '.join(f'{k} {v}' for k, v in sorted(r['superseded_executions'].items(), key=lambda kv: -kv[1]))
        executions = f'max {r["max_executions"]}; {r["ran_more_than_once"]} ran more than once'
        if reasons:
            executions += f' (runs cut short by: {reasons})'
        lines.append(
            f'| {result.side} | {r["healthy_finished"]}/{r["healthy"]} | {failed} | {pills} '
            f'| {r["lost"]} | {r["stuck"]} '
            f'| {executions} | {r["retries_spent"]} | {_seconds(r["wall_seconds"])} |'
        )
    lines += [
        '',
        '| side | faults applied | worker exits (not by the harness) | counted stalls of healthy jobs '
        '| uncounted recoveries | on_failure callbacks run | jobs with two outcomes recorded '
        '| stale outcomes landed (refused) |',
        '|' + '---|' * 8,
    ]
    for result in results:
        r = result.row()
        faults = (
            f'{_n(r["restarts"], "restart")} ({r["restarts"] - r["restarts_crash"]} SHUTDOWN, '
            f'{r["restarts_crash"]} kill -9), {_n(r["kills"], "kill")}, {_n(r["freezes"], "freeze")}'
        )
        if cfg.topology == 'sentinel':
            primaries = 'frozen primary' if r['primary_freezes'] == 1 else 'frozen primaries'
            faults = (
                f'{_n(r["failovers"], "failover")}, {r["primary_freezes"]} {primaries}, '
                f'{_n(r["kills"], "kill")}, {_n(r["freezes"], "freeze")}'
            )
        healthy_stalls = str(r['counted_stalls_healthy']) if result.side == EPOCH else 'n/a'
        recoveries = str(r['uncounted_recoveries']) if result.side == EPOCH else 'n/a'
        lines.append(
            f'| {result.side} | {faults} | {r["worker_exits_own"]} | {healthy_stalls} | {recoveries} '
            f'| {r["callbacks_run"]} | {r["jobs_with_two_outcomes"]} '
            f'| {r["stale_outcomes_landed"]} ({r["stale_outcomes_refused"] if result.side == EPOCH else "n/a"}) |'
        )
    return '\n'.join(lines)


def describe(cfg: Config) -> str:
    """One paragraph with the resolved parameters."""
    retry = f'Retry(max={cfg.retry_budget}) on every job' if cfg.retry_budget else 'no Retry'
    return (
        f'J={cfg.jobs} healthy jobs ({cfg.min_seconds}-{cfg.max_seconds} s, {cfg.callbacks:.0%} with on_failure, '
        f'{cfg.dependents:.0%} dependents), P={cfg.pills} poison pills, {cfg.workers} workers, K={cfg.restarts} '
        f'restarts (down {cfg.down_min}-{cfg.down_max} s, alternately SHUTDOWN and kill -9, appendfsync always), '
        f'W={cfg.kills} worker kills, F={cfg.freezes} freezes of {cfg.freeze_seconds:.0f} s, '
        f'{cfg.queues} queue(s) per worker, '
        f'over {cfg.duration:.0f} s; '
        f'max_stalled {cfg.max_stalled}, {retry}, heartbeat {cfg.heartbeat} s, '
        f'leases {cfg.lease(EPOCH):.0f} s (rq-epoch) / {cfg.lease(STOCK):.0f} s (stock), sweeps every '
        f'{cfg.sweep_interval} s, restart grace {cfg.restart_grace} s; server {cfg.server}; seed {cfg.seed}; '
        f'RQ {rq.__version__}'
    ) + (
        f'; Sentinel topology: a primary, {cfg.replicas} replica(s), 3 sentinels (down-after 1 s), '
        f'{cfg.failovers} failovers, {cfg.primary_freezes} frozen primaries ({cfg.primary_freeze_for:.0f} s), '
        f'min-replicas-to-write {cfg.min_replicas}'
        if cfg.topology == 'sentinel'
        else ''
    )


# -- running both sides ------------------------------------------------------------------


def run(cfg: Config, reaper: bool = False) -> list[SideResult]:
    """Run every side of ``cfg`` in turn on the same plan; return their audits."""
    plan = make_plan(cfg)
    base = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix='rq-epoch-chaos-'))
    own = cfg.workdir is None
    results: list[SideResult] = []
    try:
        for side in cfg.sides:
            print(f'--- {side}: running', flush=True)
            result = SideRun(side, cfg, plan, base / side.replace('-', '_'), reaper).run()
            print(f'--- {side}: done in {result.wall:.0f} s', flush=True)
            results.append(result)
    finally:
        if cfg.keep:
            print(f'kept {base}', flush=True)
        elif own:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for side in cfg.sides:
                shutil.rmtree(base / side.replace('-', '_'), ignore_errors=True)
    return results


def to_json(results: Sequence[SideResult], cfg: Config) -> dict[str, Any]:
    """Rows, violations and the plan's parameters, for files and tests."""
    plan = make_plan(cfg)
    return {
        'command': cfg.command(),
        'config': {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        'freeze_seconds': cfg.freeze_seconds,
        'rq': rq.__version__,
        'date': datetime.now(timezone.utc).strftime('%Y-%m-%d'),
        'faults': [asdict(f) for f in plan.faults],
        'sides': {
            r.side: {
                'row': r.row(),
                'violations': r.violations,
                'histories': r.histories,
                'notes': r.notes,
                'healthy_failed': [
                    {
                        'id': j.id,
                        'failure': j.failure,
                        'executions': j.executions,
                        'reasons': [a.reason for a in j.attempts if a.reason],
                    }
                    for j in r.jobs
                    if j.kind == 'healthy' and j.state == 'failed'
                ],
                'not_ended': [
                    {'id': j.id, 'state': j.state, 'status': j.status, 'where': j.where}
                    for j in r.jobs
                    if j.state in ('lost', 'stuck')
                ],
                'events': r.events,
            }
            for r in results
        },
    }


def parse_args(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    """Command-line options -> :class:`Config`."""
    d = Config()
    p = argparse.ArgumentParser(prog='python -m benchmarks.chaos', description=__doc__.split('\n\n')[0])
    p.add_argument('--jobs', type=int, default=d.jobs, help='healthy jobs (J)')
    p.add_argument('--pills', type=int, default=d.pills, help='poison pills (P)')
    p.add_argument('--workers', type=int, default=d.workers, help='worker processes')
    p.add_argument(
        '--restarts', type=int, default=d.restarts, help='server restarts (K), SHUTDOWN and kill -9 alternately'
    )
    p.add_argument('--kills', type=int, default=d.kills, help='worker SIGKILLs (W)')
    p.add_argument('--freezes', type=int, default=d.freezes, help='worker freezes (F)')
    p.add_argument('--duration', type=float, default=d.duration, help='seconds over which jobs and faults are spread')
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--max-stalled', type=int, default=d.max_stalled)
    p.add_argument('--retries', type=int, default=None, help='Retry(max=N) on every job (default max-stalled - 1)')
    p.add_argument('--heartbeat', type=int, default=d.heartbeat, help='--job-monitoring-interval of both sides')
    p.add_argument('--lease-margin', type=int, default=d.lease_margin)
    p.add_argument('--sweep-interval', type=int, default=d.sweep_interval)
    p.add_argument('--restart-grace', type=int, default=d.restart_grace)
    p.add_argument('--min-seconds', type=float, default=d.min_seconds)
    p.add_argument('--max-seconds', type=float, default=d.max_seconds)
    p.add_argument('--callbacks', type=float, default=d.callbacks, help='share of healthy jobs with on_failure')
    p.add_argument(
        '--dependents', type=float, default=d.dependents, help='share of healthy jobs that depend on another'
    )
    p.add_argument('--down-min', type=float, default=d.down_min)
    p.add_argument('--down-max', type=float, default=d.down_max)
    p.add_argument('--freeze-for', type=float, default=None, help='seconds (default: longest lease + 2 sweeps + 3)')
    p.add_argument('--drain', type=float, default=None, help='seconds to wait for the last jobs (default per side)')
    p.add_argument('--server', choices=('valkey', 'redis'), default=d.server)
    p.add_argument('--sides', default=','.join(d.sides), help='stock,rq-epoch (either or both, in that order)')
    p.add_argument('--respawn-delay', type=float, default=d.respawn_delay)
    p.add_argument(
        '--queues', type=int, default=d.queues, help='queues every worker listens on; each job goes to one of them'
    )
    p.add_argument('--keep', action='store_true', help='keep the work folder (logs, ledger, events)')
    p.add_argument('--workdir', default=None, help='work folder (default: a new temp folder)')
    p.add_argument(
        '--topology',
        choices=('single', 'sentinel'),
        default=d.topology,
        help="one server, or a primary with replicas and three sentinels (workers use RQ's SENTINEL settings)",
    )
    p.add_argument('--replicas', type=int, default=d.replicas, help='replicas in the Sentinel topology')
    p.add_argument('--failovers', type=int, default=d.failovers, help='SENTINEL FAILOVERs (Sentinel topology)')
    p.add_argument(
        '--primary-freezes', type=int, default=d.primary_freezes, help='SIGSTOPs of the primary (Sentinel topology)'
    )
    p.add_argument(
        '--primary-freeze-for', type=float, default=d.primary_freeze_for, help='seconds a frozen primary stays stopped'
    )
    p.add_argument(
        '--min-replicas', type=int, default=d.min_replicas, help='min-replicas-to-write on every server (Sentinel)'
    )
    p.add_argument('--json', type=Path, default=None, help='write the results as JSON here')
    p.add_argument('--markdown', type=Path, default=None, help='write the tables (markdown) here')
    ns = p.parse_args(list(argv))
    sides = tuple(s.strip() for s in ns.sides.split(',') if s.strip())
    if not sides or any(s not in SIDES for s in sides):
        p.error(f'--sides takes {", ".join(SIDES)}')
    if ns.jobs < 1 or ns.workers < 1 or ns.max_stalled < 1 or ns.duration <= 0 or ns.queues < 1:
        p.error('--jobs, --workers, --max-stalled, --duration and --queues must be positive')
    if ns.topology == 'sentinel' and ns.restarts:
        p.error('--topology sentinel: use --failovers and --primary-freezes (and --restarts 0)')
    if ns.topology != 'sentinel' and (ns.failovers or ns.primary_freezes):
        p.error('--failovers and --primary-freezes need --topology sentinel')
    values = {name: getattr(ns, name) for name in _FLAGS if name not in ('sides',)}
    cfg = Config(**{**values, 'sides': tuple(s for s in SIDES if s in sides)})
    return cfg, ns


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos comparison; exit 1 when an rq-epoch invariant fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == 'sweeper':
        return sweeper_main(args[1:])
    cfg, ns = parse_args(args)
    reaper = _become_subreaper()

    def interrupted(signum: int, frame: Any) -> None:
        """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt, so the run cleans up."""
        raise KeyboardInterrupt(f'signal {signum}')

    signal.signal(signal.SIGINT, interrupted)  # also when started with SIGINT ignored (a background job)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    print(describe(cfg), flush=True)
    print(f'command: {cfg.command()}', flush=True)
    try:
        results = run(cfg, reaper=reaper)
    except KeyboardInterrupt:
        print('interrupted; every process and temp folder of the run was removed', file=sys.stderr)
        return 130
    text = table(results, cfg)
    print()
    print(text)
    status = 0
    for result in results:
        for note in result.notes:
            print(f'{result.side}: note: {note}')
        if result.violations:
            status = 1
            print(f'\n{result.side}: {len(result.violations)} INVARIANT VIOLATION(S)')
            for violation in result.violations:
                print(f'  {violation}')
            for job_id, history in result.histories.items():
                print(f'\n  history of {job_id}:')
                for line in history:
                    print(f'    {line}')
        elif result.side == EPOCH:
            print(f'\n{result.side}: every invariant holds')
    if ns.json:
        ns.json.write_text(json.dumps(to_json(results, cfg), indent=1))
    if ns.markdown:
        ns.markdown.write_text(text + '\n')
    return status


# -- the cron-like sweeper ---------------------------------------------------------------


def sweeper_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.chaos sweeper``: sweep every ``--interval`` s until SIGTERM.

    rq-epoch: :class:`rq_epoch.Sweeper` (settings from ``RQ_EPOCH_*``); stock:
    ``StartedJobRegistry.cleanup()``. Verdicts (and, for stock, the job ids found expired
    before each cleanup) are appended to ``--out`` as JSON lines. Server outages are
    ridden out; the loop ends after ``--limit`` seconds at most.
    """
    p = argparse.ArgumentParser(prog='python -m benchmarks.chaos sweeper')
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument('--url')
    where.add_argument('--sentinel', help='host:port,... of the sentinels (a new connection each sweep, as cron)')
    p.add_argument('--side', choices=SIDES, required=True)
    p.add_argument('--queue', action='append', default=None, help='a queue to sweep (repeatable; default chaos)')
    p.add_argument('--interval', type=float, default=1.0)
    p.add_argument('--out', type=Path, required=True)
    p.add_argument('--limit', type=float, default=3600.0)
    ns = p.parse_args(list(argv))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def connect() -> redis.Redis:
        if ns.url:
            return redis.Redis.from_url(ns.url, socket_timeout=5, socket_connect_timeout=1)
        from redis.sentinel import Sentinel

        from tests.sentinel import MASTER_NAME

        instances = [(h, int(p)) for h, p in (x.rsplit(':', 1) for x in ns.sentinel.split(','))]
        sentinel = Sentinel(instances, socket_timeout=2, socket_connect_timeout=1)
        return sentinel.master_for(MASTER_NAME, socket_timeout=5, socket_connect_timeout=1)

    client = connect()
    deadline = time.monotonic() + ns.limit
    unreachable = False
    with open(ns.out, 'a', encoding='utf-8') as out:
        while not stop.is_set() and time.monotonic() < deadline:
            if ns.sentinel:
                client.close()
                client = connect()
            try:
                records = _sweep_once(client, ns.side, ns.queue or [QUEUE])
                if unreachable:
                    records.append({'event': 'server back'})
                unreachable = False
            except (*_SERVER_ERRORS, redis.exceptions.ResponseError) as exc:
                if isinstance(exc, redis.exceptions.ResponseError) and not is_outage(exc):
                    raise
                # Unreachable, or cannot take writes now (NOREPLICAS, READONLY...): as cron, try later.
                records = [] if unreachable else [{'event': 'server unreachable', 'error': str(exc)}]
                unreachable = True
            for record in records:
                out.write(json.dumps({'t': round(time.time(), 3), **record}) + '\n')
            out.flush()
            stop.wait(ns.interval)
    client.close()
    return 0


def _sweep_once(client: redis.Redis, side: str, queues: Sequence[str]) -> list[dict[str, Any]]:
    """One sweep of ``queues``: rq-epoch's sweep or stock cleanup; the records to log."""
    if side == EPOCH:
        report = rq_epoch.Sweeper(client).sweep(list(queues))
        return [
            {
                'job_id': v.job_id,
                'verdict': v.verdict,
                'stalled': v.stalled,
                'lease_epoch': v.lease_epoch,
                'run_id': v.run_id,
            }
            for v in report.verdicts
            if v.verdict != 'deferred'
        ]
    from rq.registry import StartedJobRegistry

    records = []
    for queue in queues:
        seconds, _ = client.time()
        expired = [_text(m).split(':', 1)[0] for m in client.zrangebyscore(keys.wip_key(queue), 0, seconds)]
        StartedJobRegistry(queue, connection=client).cleanup()
        records += [{'job_id': job_id, 'verdict': 'abandoned (stock cleanup)'} for job_id in expired]
    return records


if __name__ == '__main__':
    raise SystemExit(main())
