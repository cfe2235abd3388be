"""Configuration of a chaos run and its seeded plan: the workload and the fault schedule."""

from __future__ import annotations

import random
import shlex
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent.parent
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
ALLOWED_REASONS = {'kill', 'freeze', 'poison pill', 'deploy'}
#: How a rolling deploy stops a worker: ``k8s`` (SIGTERM to the worker, SIGKILL to it and its
#: work-horse after the grace: Kubernetes, ECS, ``docker stop``), ``systemd`` (SIGTERM to every
#: process at once, SIGKILL to every one after the grace: ``KillMode=control-group``, Heroku),
#: ``term-only`` (SIGTERM to the worker, then a wait: systemd ``KillMode=mixed`` and supervisor
#: with a long stop timeout), ``sigint-twice`` (Ctrl-C, and Ctrl-C again after the grace).
STOP_SEQUENCES = ('k8s', 'systemd', 'term-only', 'sigint-twice')
#: Seconds a deploy waits for a worker that was told to stop, past its grace, before SIGKILL.
DEPLOY_BOUND = 30.0
#: Seconds a kill or freeze may wait past its planned time for a worker that is running a job.
BUSY_WAIT = 10.0
#: Seconds after a promotion (or a frozen primary's thaw) during which an execution cut short is
#: attributed to the failover: the old primary stays a writable master until the sentinels
#: convert it, about 10 s later.
FAILOVER_TAIL = 15.0
SERVER_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError)


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
    #: The worker class of both sides: ``Worker`` (a forked work-horse per job), ``SpawnWorker``
    #: (a spawned one) or ``HerokuWorker``; rq-epoch's side runs ``rq_epoch.<class>``, stock ``rq.<class>``.
    worker_class: str = 'Worker'
    #: Rolling deploys: each stops every worker in turn, with a stop sequence and grace drawn per worker.
    deploys: int = 0
    #: ``RQ_EPOCH_SHUTDOWN_TIMEOUT`` of rq-epoch's workers (seconds).
    shutdown_timeout: int = 3

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
        for name, flag in FLAGS.items():
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


#: Worker classes a chaos run can use (the job must run in a work-horse: the ledger records its parent).
WORKER_CLASSES = ('Worker', 'SpawnWorker', 'HerokuWorker')

FLAGS = {
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
    'worker_class': '--worker-class',
    'deploys': '--deploys',
    'shutdown_timeout': '--shutdown-timeout',
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
    #: A deploy ('deploy'): (stop sequence, grace in seconds) for each worker slot, stopped in turn.
    steps: tuple[tuple[str, float], ...] = ()


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
    # Rolling deploys, drawn after everything else for the same reason; spread evenly.
    if cfg.deploys:
        span = (end - start) / cfg.deploys
        for k in range(cfg.deploys):
            at = start + span * (k + 0.5) + rng.uniform(-0.2, 0.2) * span
            steps = tuple(
                (rng.choice(STOP_SEQUENCES), draw_grace(rng, cfg.shutdown_timeout)) for _ in range(cfg.workers)
            )
            faults.append(FaultSpec(round(at, 3), 'deploy', 0, 0.0, steps))
    faults.sort(key=lambda f: (f.at, f.kind))
    return Plan(tuple(jobs), tuple(faults))


def draw_grace(rng: random.Random, shutdown_timeout: int) -> float:
    """A deploy's grace for one worker: half the time shorter than the shutdown timeout (the worker
    is killed before it could hand its job back), half the time longer (it hands the job back)."""
    if rng.random() < 0.5:
        return round(rng.uniform(0.3, max(0.5, shutdown_timeout * 0.8)), 2)
    return round(rng.uniform(shutdown_timeout + 1.5, shutdown_timeout + 5.0), 2)
