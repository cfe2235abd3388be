"""Expired leases made in bulk, as each side's worker leaves them, and the cleanups measured on them.

A benchmark of 100,000 expired leases can't wait for 100,000 workers to die, so this
module enqueues real jobs (RQ's ``enqueue_many``) and then makes, in pipelines, the calls
each worker makes when it starts a job (``Execution.create`` in the worker, then
``Job.prepare_for_execution`` in the work-horse), so the writes follow the installed RQ:

* both: the job leaves its queue; the execution hash (with its TTL), the job's execution
  registry, the worker's execution index (RQ 3); the job hash gets ``status=started``,
  ``started_at``, ``last_heartbeat`` and ``worker_name`` and loses its TTL;
* stock RQ: ``rq:wip:<queue>`` member ``<job>:<execution>`` scored with the deadline;
* rq-epoch (``rq_epoch.Job``'s registry): the ``rq:wip`` member scored ``+inf``, and the
  grant script: the lease in ``rq:epoch:lease:<queue>`` (member: the job id) and
  ``lease_epoch`` / ``lease_execution`` in the job hash.

An expired lease is the state the server holds when a sweep or a cleanup finds it: the
deadline is one second in the past, and the execution hash, whose TTL the worker sets to
the same lease length, has expired with it (deleted here, as the server would); the job's
execution registry and the worker's execution index (TTL one minute longer) are still
there. :func:`validate` checks this layout against real workers killed with SIGKILL mid-job
(a test runs it).

A *case* names who cleans the leases and which verdict the jobs get:

============  ========  ==============================================================
case          side      jobs and verdict
============  ========  ==============================================================
stock-retry   stock     one retry left: ``StartedJobRegistry.cleanup()`` requeues them
exempt        rq-epoch  stamped by another server process: requeued, not counted
recovered     rq-epoch  stamped by this process, stall budget left: counted, requeued
stock-fail    stock     no retry: failed, failure Result, callback, dependents
dead          rq-epoch  stamped by this process, ``max_stalled=1``: the same side effects
============  ========  ==============================================================

Every job has an ``on_failure`` callback; in the failing cases one job in ten has a
dependent with ``allow_failure``, which each side must enqueue. Each case runs on a flushed
server and is checked afterwards (requeued, failed, callbacks run, dependents enqueued).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Callback, Queue, Retry
from rq.executions import Execution
from rq.job import Dependency
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.utils import now as rq_now

from rq_epoch import Job as EpochJob
from rq_epoch import Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.pids import children_of, send_signal
from rq_epoch.protocol import keys, scripts

from . import jobs as job_functions
from .harness import EPOCH, ROOT, STOCK, command_delta, commandstats, count_traffic, worker_argv, worker_env

#: A valid run_id of some other server process (stamps that crossed a restart).
OTHER_EPOCH = '5d0c3ab4f1e2d3c4b5a69788796a5b4c3d2e1f00'
#: RQ's default job monitoring interval, and rq-epoch's default heartbeat and lease margin.
STOCK_TTL = 30 + 60
EPOCH_TTL = 30 + 30
CHUNK = 1000


@dataclass
class JobSet:
    """Jobs of one queue made by :func:`enqueue_jobs`."""

    queue: str
    job_ids: list[str]
    dependent_ids: list[str] = field(default_factory=list)


def _chunks(items: list[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def enqueue_jobs(
    conn: redis.Redis,
    queue_name: str,
    n: int,
    *,
    retry: bool = False,
    on_failure: bool = True,
    dependents_every: int = 0,
    func: str = 'benchmarks.jobs.noop',
    args: tuple[Any, ...] = (),
) -> JobSet:
    """Enqueue ``n`` jobs with RQ's own ``enqueue_many`` (the same jobs for both sides).

    ``retry`` gives each job one retry (stock cleanup then requeues it instead of failing
    it); ``on_failure`` gives it a failure callback; every ``dependents_every``-th job gets
    one dependent that runs even if it fails (``allow_failure``).
    """
    queue = Queue(queue_name, connection=conn)
    on_fail = Callback('benchmarks.jobs.on_failure_count') if on_failure else None
    job_ids: list[str] = []
    for chunk in _chunks(list(range(n))):
        datas = [
            Queue.prepare_data(func, args=args, retry=Retry(max=1) if retry else None, on_failure=on_fail)
            for _ in chunk
        ]
        with conn.pipeline() as pipe:
            jobs = queue.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
        job_ids += [job.id for job in jobs]
    dependent_ids: list[str] = []
    if dependents_every > 0:
        parents = job_ids[::dependents_every]
        for chunk in _chunks(parents):
            datas = [
                Queue.prepare_data('benchmarks.jobs.noop', depends_on=Dependency(jobs=[p], allow_failure=True))
                for p in chunk
            ]
            with conn.pipeline() as pipe:
                jobs = queue.enqueue_many(datas, pipeline=pipe)
                pipe.execute()
            dependent_ids += [job.id for job in jobs]
    return JobSet(queue_name, job_ids, dependent_ids)


def server_time(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def start_jobs(
    conn: redis.Redis,
    jobs: JobSet,
    side: str,
    *,
    stamp: str | None = None,
    expired: bool = True,
    worker_prefix: str = 'bench-worker',
) -> list[str]:
    """Put every job of ``jobs`` in the started state ``side``'s worker leaves.

    The writes are RQ's own (``Execution.create``, ``Job.prepare_for_execution``, as the
    worker and its work-horse call them), so they follow the installed RQ; for rq-epoch,
    ``rq_epoch.Job``'s registry queues the real grant script. Then, for an expired lease,
    the deadline is moved one second into the past, and ``stamp`` (rq-epoch only), when
    given, replaces the ``lease_epoch`` the grant wrote. Returns RQ's names of the
    executions, ``<job_id>:<execution_id>`` (stock RQ's lease members; rq-epoch's lease
    member is the job id before the colon).
    """
    if side not in (STOCK, EPOCH):
        raise ValueError(f'side must be {STOCK!r} or {EPOCH!r}')
    job_class: type[RQJob] = RQJob if side == STOCK else EpochJob
    ttl = STOCK_TTL if side == STOCK else EPOCH_TTL
    if side == EPOCH:
        scripts.load_all(conn)
    conn.delete(Queue(jobs.queue, connection=conn).key)  # every job was dequeued
    members: list[str] = []
    for offset, chunk in enumerate(_chunks(jobs.job_ids)):
        started = [job for job in job_class.fetch_many(chunk, connection=conn) if job is not None]
        with conn.pipeline(transaction=False) as pipe:
            for i, job in enumerate(started):
                worker = f'{worker_prefix}-{offset * CHUNK + i}'
                execution = Execution.create(job, ttl, pipeline=pipe, worker_name=worker)
                job.heartbeat(rq_now(), ttl, pipeline=pipe)
                job.prepare_for_execution(worker, pipeline=pipe)
                pipe.persist(job.key)
                members.append(execution.composite_key)
            pipe.execute()
    if expired or stamp is not None:
        _age(conn, jobs.queue, members, side, stamp, expired)
    return members


def _age(conn: redis.Redis, queue: str, members: list[str], side: str, stamp: str | None, expired: bool) -> None:
    """Move deadlines one second into the past (the execution hash expires with the lease);
    write another ``lease_epoch`` if asked."""
    key = keys.wip_key(queue) if side == STOCK else keys.leases_key(queue)
    deadline = (time.time() if side == STOCK else server_time(conn)) - 1.0
    for chunk in _chunks(members):
        with conn.pipeline(transaction=False) as pipe:
            for member in chunk:
                if expired:
                    pipe.zadd(key, {member if side == STOCK else member.split(':', 1)[0]: deadline}, xx=True)
                    pipe.delete(keys.execution_key(member))
                if stamp is not None and side == EPOCH:
                    pipe.hset(keys.job_key(member.split(':', 1)[0]), 'lease_epoch', stamp)
            pipe.execute()


# -- the layout checked against real workers killed mid-job --------------------------------------------------------

_UUID = re.compile(r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}')
_RUN_ID = re.compile(r'\b[0-9a-f]{40}\b')
_EXEC = re.compile(r'\b[0-9a-f]{32}\b')
#: Worker registration (written by a live worker, read by neither cleanup) and the sweep's
#: own bookkeeping: per queue, its record of primary epochs and the workers' sweep tickets (a
#: worker's start-up sweep writes them, not the start of a job), and the record of life (written
#: by any script, once a second), and the workers' turns (the idle workers' turns to take, written
#: by whichever worker waits, and the turns to ask for sweep tickets, by whichever worker lost one).
_IGNORED = re.compile(
    '^'
    + re.escape(keys.PREFIX)
    + r':(workers(:.*)?|worker:<worker>|clean_groups|queues|epoch:(limbo|stats):.*|epoch:(primaries|tickets|alive)'
    + r'|epoch:(turns|sweepturns):.*'
    + r'|queue:.*:intermediate:first_seen:.*)$'
)


def _normal(text: str, workers: list[str]) -> str:
    for name in workers:
        text = text.replace(name, '<worker>')
    return _EXEC.sub('<exec>', _RUN_ID.sub('<run_id>', _UUID.sub('<job>', text)))


def _score(score: float, now: float) -> str:
    if score == float('inf'):
        return '+inf'
    return 'future' if score > now else 'past'


def _s(value: Any) -> str:
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)


def _worker_names(conn: redis.Redis, names: list[str]) -> set[str]:
    worker_prefix = keys.worker_key('')
    found = {n[len(worker_prefix) :].split(':')[0] for n in names if n.startswith(worker_prefix)}
    found.discard('')
    for name in names:
        if name.startswith((keys.job_key(''), keys.execution_key(''))) and _s(conn.type(name)) == 'hash':
            worker = conn.hget(name, 'worker_name')
            if worker:
                found.add(_s(worker))
    return found


def layout(conn: redis.Redis) -> dict[str, Any]:
    """Every key, with ids replaced by placeholders: type, TTL or not, fields or members."""
    now = server_time(conn)
    names = [_s(k) for k in conn.scan_iter(count=1000)]
    workers = sorted(_worker_names(conn, names), key=len, reverse=True)
    shown = ('status', 'worker_name', 'lease_epoch', 'lease_execution', 'job_id', 'id')
    found: dict[str, Any] = {}
    for name in names:
        key = _normal(name, workers)
        if _IGNORED.match(key):
            continue
        kind = _s(conn.type(name))
        value: Any = None
        if kind == 'hash':
            fields = {_s(k): _s(v) for k, v in dict(conn.hgetall(name)).items()}
            value = sorted(f'{k}={_normal(v, workers)}' if k in shown else k for k, v in fields.items())
        elif kind == 'zset':
            pairs: list[Any] = list(conn.zrange(name, 0, -1, withscores=True))
            value = sorted({f'{_normal(_s(m), workers)}@{_score(float(sc), now)}' for m, sc in pairs})
        elif kind == 'set':
            value = sorted({_normal(_s(m), workers) for m in conn.smembers(name)})
        elif kind == 'list':
            value = sorted({_normal(_s(m), workers) for m in conn.lrange(name, 0, -1)})
        found[key] = {'type': kind, 'expires': int(conn.ttl(name)) > 0, 'value': value}
    return found


def _kill_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        horses = children_of(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        for pid in horses:
            send_signal(pid, signal.SIGKILL)
        proc.wait(10)


def real_layout(srv: EmbeddedServer, side: str, n_jobs: int = 2, timeout: float = 30.0) -> dict[str, Any]:
    """Start ``n_jobs`` real workers of ``side`` on one job each, SIGKILL them mid-job, and
    return the :func:`layout` they leave."""
    conn = srv.client()
    conn.flushall()
    queue = Queue('check', connection=conn)
    for _ in range(n_jobs):
        queue.enqueue(
            'benchmarks.jobs.sleep_for', 60, retry=Retry(max=1), on_failure=Callback('benchmarks.jobs.on_failure_count')
        )
    procs = [
        subprocess.Popen(
            worker_argv(srv.url, side, ['check'], '--burst', '--name', f'real-{i}'),
            cwd=ROOT,
            env=worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(n_jobs)
    ]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = sum(1 for k in conn.scan_iter(keys.job_key('*')) if conn.hget(k, 'status') == b'started')
            if started == n_jobs and conn.zcard(keys.wip_key('check')) == n_jobs:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # let each work-horse finish its own start-up writes
    finally:
        _kill_workers(procs)
    return layout(conn)


def fixture_layout(conn: redis.Redis, side: str, n_jobs: int = 2) -> dict[str, Any]:
    """The :func:`layout` that :func:`start_jobs` writes for ``n_jobs`` running jobs."""
    conn.flushall()
    jobs = enqueue_jobs(conn, 'check', n_jobs, retry=True, func='benchmarks.jobs.sleep_for', args=(60,))
    start_jobs(conn, jobs, side, expired=False)
    return layout(conn)


def validate(kind: str = 'valkey', n_jobs: int = 2) -> dict[str, list[str]]:
    """Differences between real killed workers and the fixture, per side (empty: same layout)."""
    differences: dict[str, list[str]] = {}
    with EmbeddedServer(kind) as srv:
        conn = srv.client()
        for side in (STOCK, EPOCH):
            real = real_layout(srv, side, n_jobs)
            ours = fixture_layout(conn, side, n_jobs)
            diffs = []
            for key in sorted(set(real) | set(ours)):
                if real.get(key) != ours.get(key):
                    diffs.append(f'{key}: real worker {real.get(key)} / fixture {ours.get(key)}')
            differences[side] = diffs
    return differences


# -- the cleanups -----------------------------------------------------------------------------

QUEUE = 'bench'
DEPENDENTS_EVERY = 10
#: Bound on the rounds of dead-letter finishing after a sweep (1,000 each).
MAX_FINISH_ROUNDS = 1_000


@dataclass(frozen=True)
class Case:
    """Who cleans, and what the jobs look like."""

    name: str
    side: str
    requeue: bool
    stamp: str | None = None
    max_stalled: int = 3


CASES: dict[str, Case] = {
    'stock-retry': Case('stock-retry', STOCK, requeue=True),
    'exempt': Case('exempt', EPOCH, requeue=True, stamp=OTHER_EPOCH),
    'recovered': Case('recovered', EPOCH, requeue=True, max_stalled=3),
    'stock-fail': Case('stock-fail', STOCK, requeue=False),
    'dead': Case('dead', EPOCH, requeue=False, max_stalled=1),
}
#: The stock case each rq-epoch case is compared with.
BASELINE = {'exempt': 'stock-retry', 'recovered': 'stock-retry', 'dead': 'stock-fail'}


@dataclass
class Outcome:
    """One case at one size: time, traffic, and whether the jobs ended where they should."""

    case: str
    side: str
    n: int
    seconds: float
    round_trips: int
    server_commands: int
    checks: dict[str, Any]
    ok: bool
    script: dict[str, float] = field(default_factory=dict)
    during: Any = None


def prepare(conn: redis.Redis, case: Case, n: int) -> JobSet:
    """Flush, enqueue ``n`` jobs for ``case`` and leave them started with expired leases."""
    conn.flushall()
    dependents = 0 if case.requeue else DEPENDENTS_EVERY
    jobs = enqueue_jobs(conn, QUEUE, n, retry=case.requeue, on_failure=True, dependents_every=dependents)
    start_jobs(conn, jobs, case.side, stamp=case.stamp)
    return jobs


def cleaner(conn: redis.Redis, case: Case, batch_size: int | None = None) -> Callable[[], Any]:
    """The call that cleans the queue: stock cleanup, or the sweep with the case's settings.

    One sweep finishes at most 1,000 dead letters (their side effects); the rest wait for
    the next sweep. Stock cleanup does every side effect in one call, so the rq-epoch side
    goes on finishing until none is left, and all of that is timed.
    """
    if case.side == STOCK:
        return lambda: StartedJobRegistry(QUEUE, connection=conn).cleanup()
    sweeper = Sweeper(conn, max_stalled=case.max_stalled, restart_grace=0, batch_size=batch_size)

    def sweep() -> None:
        sweeper.sweep([QUEUE])
        for _ in range(MAX_FINISH_ROUNDS):
            if not sweeper.finish_dead_letters():
                break

    return sweep


def check(conn: redis.Redis, case: Case, jobs: JobSet, callbacks: int) -> dict[str, Any]:
    """Where the jobs ended (``found``) and where they should have (``expected``)."""
    n = len(jobs.job_ids)
    sample = jobs.job_ids[:: max(1, n // 20)]
    statuses = {conn.hget(keys.job_key(j), 'status') for j in sample}
    found: dict[str, Any] = {
        'queued': conn.llen(keys.queue_key(QUEUE)),
        'failed': FailedJobRegistry(QUEUE, connection=conn).count,
        'left_started': conn.zcard(keys.wip_key(QUEUE)) + conn.zcard(keys.leases_key(QUEUE)),
        'statuses': sorted(_s(s) for s in statuses if s is not None),
    }
    if case.requeue:
        return {'expected': {'queued': n, 'failed': 0, 'left_started': 0, 'statuses': ['queued']}, 'found': found}
    found['callbacks'] = callbacks
    found['results_in_sample'] = sum(1 for j in sample if conn.exists(keys.results_key(j)))
    expected = {
        'queued': len(jobs.dependent_ids),
        'failed': n,
        'left_started': 0,
        'statuses': ['failed'],
        'callbacks': n,
        'results_in_sample': len(sample),
    }
    return {'expected': expected, 'found': found}


def run_case(
    conn: redis.Redis,
    case_name: str,
    n: int,
    *,
    batch_size: int | None = None,
    around: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Outcome:
    """Prepare ``n`` expired leases, clean them once (timed, counted), and check the result.

    ``around`` wraps only the timed cleanup (the latency benchmark runs its PING client there).
    """
    case = CASES[case_name]
    jobs = prepare(conn, case, n)
    clean = cleaner(conn, case, batch_size)
    job_functions.FAILURE_CALLBACKS = 0
    conn.config_resetstat()
    before = commandstats(conn)
    with (around or nullcontext)() as probe:
        with count_traffic() as traffic:
            start = time.perf_counter()
            clean()
            seconds = time.perf_counter() - start
    delta = command_delta(before, commandstats(conn))
    scripts_run = conn.info('commandstats').get('cmdstat_evalsha', {})
    checks = check(conn, case, jobs, job_functions.FAILURE_CALLBACKS)
    outcome = Outcome(
        case=case.name,
        side=case.side,
        n=n,
        seconds=seconds,
        round_trips=traffic.round_trips,
        server_commands=sum(delta.values()),
        checks=checks,
        ok=checks['expected'] == checks['found'],
        during=probe,
    )
    if scripts_run:
        outcome.script = {
            'calls': int(scripts_run['calls']),
            'ms_mean': round(float(scripts_run['usec_per_call']) / 1000.0, 3),
            'us_per_member': round(float(scripts_run['usec']) / n, 2),
        }
    return outcome
