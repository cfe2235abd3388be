"""Expired leases cleaned by each side: stock ``StartedJobRegistry.cleanup()`` and rq-epoch's sweep.

A *case* names who cleans and which verdict the jobs get:

============  ===========  ==============================================================
case          side         jobs and verdict
============  ===========  ==============================================================
stock-retry   stock        one retry left: stock cleanup requeues them
exempt        rq-epoch     stamped by another server process: requeued, not counted
recovered     rq-epoch     stamped by this process, stall budget left: counted, requeued
stock-fail    stock        no retry: failed, failure Result, callback, dependents
dead          rq-epoch     stamped by this process, ``max_stalled=1``: the same side effects
floor         floor        as ``exempt``, cleaned by :data:`FLOOR_SCRIPT`: only the essential
                           writes of an uncounted requeue, the same batches
dead-floor    floor        as ``stock-fail``, failed by :func:`fail_like_rq`: RQ's side
                           effects alone, in batches, as few round trips as RQ's functions allow
============  ===========  ==============================================================

The floor is what no sweep can go below with RQ's bookkeeping: per lease, read the job's
status and stamp, drop the lease, RQ's ``wip`` entry and the execution records, set the
status to queued and push the job back; per call, read the run_id once.

The dead-letter floor is the same for failures: what no cleanup can go below while RQ's own
functions write the side effects, each called as often as RQ calls it (see
:func:`fail_like_rq`). Both sides of ``stock-fail`` and ``dead`` do all of it. rq-epoch's
dead letters take RQ 3's two steps of enqueueing dependents once per batch instead of once per
job (``rq_epoch/dependents.py``), so with dependents they may go below this floor.

Every job has an ``on_failure`` callback; in the failing cases one job in ten has a
dependent with ``allow_failure``, which each side must enqueue. Each case runs on a flushed
server and is checked afterwards (requeued, failed, callbacks run, dependents enqueued).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from textwrap import indent
from typing import Any

import redis
from rq.exceptions import AbandonedJobError
from rq.job import Job as StockJob
from rq.job import JobStatus
from rq.queue import Queue as StockQueue
from rq.registry import FailedJobRegistry
from rq.registry import StartedJobRegistry as StockStartedJobRegistry
from rq.timeouts import UnixSignalDeathPenalty
from rq.utils import current_timestamp

from rq_epoch import Sweeper, compat, keys, scripts
from rq_epoch.deadletters import CLAIM_BATCH

from . import jobs as job_functions
from .common import EPOCH, STOCK, command_delta, commandstats, count_traffic, timed
from .fixture import OTHER_EPOCH, JobSet, enqueue_jobs, start_jobs

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
    #: Whose workers started the jobs (default: the side's own; rq-epoch's for the requeue floor).
    started_by: str | None = None


FLOOR = 'floor'
DEAD_FLOOR = 'dead-floor'

#: What the floors do first, once per call: the run_id, the time, the queue key, the expired leases.
_FLOOR_HEAD = """
local info = redis.call('INFO', 'server')
local run_id = string.match(info, 'run_id:([0-9a-f]+)')
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix, queue = ARGV[1], ARGV[2]
local queue_key = prefix .. ':queue:' .. queue
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
"""

#: Per lease, the floors' writes that drop the lease of ``job_id`` and RQ's records of its
#: execution ``member`` (``<job_id>:<exec_id>``), one command per write.
_DROP_WRITES = """\
redis.call('ZREM', KEYS[1], job_id)
redis.call('ZREM', KEYS[2], member)
local execution_key = prefix .. ':execution:' .. member
local worker = redis.call('HGET', execution_key, 'worker_name')
redis.call('DEL', execution_key)
redis.call('ZREM', prefix .. ':executions:' .. job_id, exec_id)
if worker then redis.call('SREM', prefix .. ':worker:' .. worker .. ':executions', member) end
"""

#: The essential writes of an uncounted requeue, batch by batch (KEYS: leases, wip; ARGV:
#: key prefix, queue name, batch). A lease's member is the job id; the job's
#: ``lease_execution`` names the execution whose records go. Returns the number of leases
#: it read.
FLOOR_SCRIPT = (
    _FLOOR_HEAD
    + """
for _, job_id in ipairs(members) do
  local job_key = prefix .. ':job:' .. job_id
  local f = redis.call('HMGET', job_key, 'status', 'lease_epoch', 'lease_execution')
  if f[1] == 'started' and f[2] ~= run_id then
    local exec_id = f[3]
    local member = job_id .. ':' .. exec_id
"""
    + indent(_DROP_WRITES, '    ')
    + """    redis.call('HSET', job_key, 'status', 'queued')
    redis.call('LPUSH', queue_key, job_id)
  end
end
return #members
"""
)

#: The tables of the writes gathered per call (see _GATHER_DROP and _SEND_GATHERED).
_GATHER_TABLES = """\
local leases, entries, records, pushes, workers, worker_keys = {}, {}, {}, {}, {}, {}
"""

#: Per lease, the drop writes of _DROP_WRITES gathered instead of sent: the lease ``job_id``,
#: RQ's entry ``member`` (``<job_id>:<exec_id>``, declared here) and the execution record go to
#: one command each per call; the job's own executions set is written at once.
_GATHER_DROP = """\
local member = job_id .. ':' .. exec_id
leases[#leases + 1] = job_id
entries[#entries + 1] = member
local execution_key = prefix .. ':execution:' .. member
local worker = redis.call('HGET', execution_key, 'worker_name')
records[#records + 1] = execution_key
redis.call('ZREM', prefix .. ':executions:' .. job_id, exec_id)
if worker then
  local key = prefix .. ':worker:' .. worker .. ':executions'
  if not workers[key] then workers[key] = {}; worker_keys[#worker_keys + 1] = key end
  table.insert(workers[key], member)
end
"""

#: Once per call, the gathered writes sent (and the jobs in ``pushes`` pushed back).
_SEND_GATHERED = """\
if #leases > 0 then
  redis.call('ZREM', KEYS[1], unpack(leases))
  redis.call('ZREM', KEYS[2], unpack(entries))
  redis.call('DEL', unpack(records))
  for _, key in ipairs(worker_keys) do redis.call('SREM', key, unpack(workers[key])) end
  redis.call('LPUSH', queue_key, unpack(pushes))
end
"""

#: The same writes with those that name one key for many leases sent once per call (one
#: ZREM of the leases, one of RQ's registry, one DEL of the execution records, one SREM per
#: worker, one LPUSH), as the sweep sends them: the floor for a script that gathers its writes.
FLOOR_GATHERED_SCRIPT = (
    _FLOOR_HEAD
    + _GATHER_TABLES
    + """for _, job_id in ipairs(members) do
  local job_key = prefix .. ':job:' .. job_id
  local f = redis.call('HMGET', job_key, 'status', 'lease_epoch', 'lease_execution')
  if f[1] == 'started' and f[2] ~= run_id then
    local exec_id = f[3]
"""
    + indent(_GATHER_DROP, '    ')
    + """    redis.call('HSET', job_key, 'status', 'queued')
    pushes[#pushes + 1] = job_id
  end
end
"""
    + _SEND_GATHERED
    + """return #members
"""
)

#: The floor with the writes that rq-epoch's specification adds to a requeue, and nothing else
#: (``docs/design.md``: the verdict table, the job's fields, fencing): the job's uncounted-recovery
#: count goes up for an exempt lease and its stall count for a counted one (the stall budget,
#: ``max_stalled``, read to tell a recovery from a death), and the job records that a sweep took
#: the execution's lease (``taken:<execution>``), which is how a late heartbeat learns that its
#: lease is gone. One command per write, as the floor. No verdict records, no restart grace, no
#: replica check, no stock entries, no stall history; only the two counters the interleaved run
#: checks (``recovered``, ``last_sweep``). Called like the sweep script (its KEYS and ARGV) on the
#: leases the script judges, with its reply's shape: what the specification adds to the floor,
#: measured the floor's way (a sweep that gathers its writes can cost less than this).
SPECIFIED_FLOOR_SCRIPT = (
    _FLOOR_HEAD
    + """
local recovered = 0
for _, job_id in ipairs(members) do
  local job_key = prefix .. ':job:' .. job_id
  local f = redis.call('HMGET', job_key, 'status', 'lease_epoch', 'lease_execution', 'stalled', 'max_stalled',
                       'exempt_recoveries')
  if f[1] == 'started' then
    local exec_id = f[3]
    local member = job_id .. ':' .. exec_id
    local counted = f[2] == run_id
    local stalled = tonumber(f[4]) or 0
    local max_stalled = tonumber(f[5]) or tonumber(ARGV[4])
    if not counted or stalled + 1 < max_stalled then
"""
    + indent(_DROP_WRITES, '      ')
    + """      if counted then
        redis.call('HSET', job_key, 'status', 'queued', 'stalled', stalled + 1, 'taken:' .. exec_id, 'recovered')
        recovered = recovered + 1
      else
        redis.call('HSET', job_key, 'status', 'queued', 'exempt_recoveries', (tonumber(f[6]) or 0) + 1,
                   'taken:' .. exec_id, 'exempt')
      end
      redis.call('LPUSH', queue_key, job_id)
    end
  end
end
if recovered > 0 then redis.call('HINCRBY', KEYS[4], 'recovered', recovered) end
redis.call('HSET', KEYS[4], 'last_sweep', tostring(now))
local more = 0
if #members >= tonumber(ARGV[3]) then more = 1 end
return {run_id, 0, tostring(now), 'master', 0, 0, 0, 0, more, 0, 0, 0, #members, ''}
"""
)

#: The sweep's duties for its two requeue verdicts, written as one compact loop: what a script
#: that does everything the sweep does for a common lease, and nothing for any other, costs.
#: Per call, the sweep's reads (the run_id and uptime, the primary epoch with ``INFO replication``
#: and the primaries hash, the 0.2.0 lease key, stock workers' expired entries) and writes (the
#: counters, ``last_sweep``, the queues set); per lease, the sweep's read of seven job fields and
#: its writes, gathered the way it gathers them: the lease, RQ's entry, the execution records,
#: the worker's execution set, the job requeued with ``started_at`` cleared and the taken record,
#: ``exempt_recoveries`` (exempt) or ``stalled`` and ``stall_epochs`` (recovered), and a verdict
#: record in the reply. A lease that is not a started job's own, or would be deferred or dead,
#: is left in place (no verdict rule for it, no encoding of odd members): the reference has the
#: sweep's commands and none of its structure. ``-- @include _epoch.lua`` is expanded by
#: :func:`compact_script`.
COMPACT_SCRIPT = (
    """-- @include _epoch.lua
local run_id, uptime = current_epoch()
local now = server_now()
local prefix, queue = ARGV[1], ARGV[2]
local batch, default_max, grace = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local primary = primary_epoch(run_id, uptime, now, prefix .. ':epoch:primaries', true)
local queue_key = prefix .. ':queue:' .. queue
local legacy_left = redis.call('EXISTS', KEYS[5]) == 1
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
"""
    + _GATHER_TABLES
    + """local lines, exempt, recovered = {}, 0, 0
for _, job_id in ipairs(members) do
  local job_key = prefix .. ':job:' .. job_id
  local f = redis.call('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled', 'lease_execution',
                       'exempt_recoveries', 'stall_epochs')
  local exec_id, counted = f[5], f[2] == run_id
  local stalled, max_stalled = tonumber(f[3]) or 0, tonumber(f[4]) or default_max
  if f[1] == 'started' and exec_id and not legacy_left and primary.age >= grace
      and not (counted and stalled + 1 >= max_stalled) then
"""
    + indent(_GATHER_DROP, '    ')
    + """    local verdict = 'exempt'
    if counted then
      verdict, stalled = 'recovered', stalled + 1
      local epochs = f[7]
      if epochs and epochs ~= '' then epochs = epochs .. ',' .. run_id else epochs = run_id end
      redis.call('HSET', job_key, 'status', 'queued', 'started_at', '', 'stalled', stalled, 'stall_epochs', epochs,
                 'taken:' .. exec_id, verdict)
      recovered = recovered + 1
    else
      redis.call('HSET', job_key, 'status', 'queued', 'started_at', '', 'exempt_recoveries',
                 (tonumber(f[6]) or 0) + 1, 'taken:' .. exec_id, verdict)
      exempt = exempt + 1
    end
    pushes[#pushes + 1] = job_id
    -- The counts as read (a number joined to a string is formatted with sprintf each time).
    local stalled_text = counted and tostring(stalled) or f[3] or '0'
    lines[#lines + 1] = verdict .. ' ' .. stalled_text .. ' ' .. (f[4] or ARGV[4]) .. ' ' .. job_id .. ' '
                        .. (f[2] or '')
  end
end
"""
    + _SEND_GATHERED
    + """if #leases > 0 then redis.call('SADD', prefix .. ':queues', queue_key) end
local stock = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
if exempt > 0 then redis.call('HINCRBY', KEYS[4], 'exempt', exempt) end
if recovered > 0 then redis.call('HINCRBY', KEYS[4], 'recovered', recovered) end
redis.call('HSET', KEYS[4], 'last_sweep', tostring(now))
local more = 0
if #members >= batch or #stock >= batch then more = 1 end
return {run_id, tostring(uptime), tostring(now), primary.role, tostring(primary.age), primary.online,
        primary.expected, tostring(primary.first), more, #members - #leases, 0, 0, #lines, table.concat(lines, '\\n')}
"""
)


def compact_script() -> str:
    """:data:`COMPACT_SCRIPT` with the helpers it shares with rq-epoch's scripts pasted in."""
    return scripts._expand(COMPACT_SCRIPT)


#: Less than any sweep can do: read each expired lease's job and drop the lease, nothing else
#: (the job is not requeued, RQ's records stay). How the cost of walking the lease set and the
#: keyspace grows with N, apart from the writes.
READ_AND_DROP_SCRIPT = (
    _FLOOR_HEAD
    + """
for _, job_id in ipairs(members) do
  redis.call('HMGET', prefix .. ':job:' .. job_id, 'status', 'lease_epoch', 'lease_execution')
  redis.call('ZREM', KEYS[1], job_id)
end
return #members
"""
)

CASES: dict[str, Case] = {
    'stock-retry': Case('stock-retry', STOCK, requeue=True),
    'exempt': Case('exempt', EPOCH, requeue=True, stamp=OTHER_EPOCH),
    'recovered': Case('recovered', EPOCH, requeue=True, max_stalled=3),
    'stock-fail': Case('stock-fail', STOCK, requeue=False),
    'dead': Case('dead', EPOCH, requeue=False, max_stalled=1),
    FLOOR: Case(FLOOR, FLOOR, requeue=True, stamp=OTHER_EPOCH),
    DEAD_FLOOR: Case(DEAD_FLOOR, FLOOR, requeue=False, started_by=STOCK),
}
#: The stock case each rq-epoch (or floor) case is compared with.
BASELINE = {'exempt': 'stock-retry', 'recovered': 'stock-retry', 'dead': 'stock-fail', DEAD_FLOOR: 'stock-fail'}
#: The floor each case is measured against.
FLOOR_OF = {
    'stock-retry': FLOOR,
    'exempt': FLOOR,
    'recovered': FLOOR,
    'stock-fail': DEAD_FLOOR,
    'dead': DEAD_FLOOR,
}
REQUEUE_CASES = ('stock-retry', 'exempt', 'recovered')
DEAD_CASES = ('stock-fail', 'dead')


@dataclass
class Outcome:
    """One case at one size: time, traffic, and whether the jobs ended where they should."""

    case: str
    side: str
    n: int
    seconds: float
    round_trips: int
    client_commands: int
    server_commands: int
    server_commands_top: dict[str, int]
    checks: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.n / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data['members_per_second'] = round(self.per_second, 1)
        data['seconds'] = round(self.seconds, 4)
        return data


def prepare(conn: redis.Redis, case: Case, n: int, dependents_every: int = DEPENDENTS_EVERY) -> JobSet:
    """Flush, enqueue ``n`` jobs for ``case`` and leave them started with expired leases.

    In the failing cases every ``dependents_every``-th job gets a dependent (0: none).
    """
    conn.flushall()
    jobs = enqueue_jobs(
        conn, QUEUE, n, retry=case.requeue, on_failure=True, dependents_every=0 if case.requeue else dependents_every
    )
    started_by = case.started_by or (EPOCH if case.side == FLOOR else case.side)
    start_jobs(conn, jobs, started_by, stamp=case.stamp)
    return jobs


def fail_like_rq(conn: redis.Redis, batch: int = CLAIM_BATCH) -> None:
    """Fail every expired job of :data:`QUEUE`'s ``wip`` as stock cleanup does, with RQ's own
    functions, in as few round trips as they allow: the dead-letter floor.

    Per batch (rq-epoch's claim batch): one round trip reads the job hashes and whether each
    job has dependents; per job, its ``on_failure`` callback under the death penalty; one
    transaction writes RQ's failure bookkeeping (``record_job_failure``: status, job hash,
    TTLs, FailedJobRegistry, failure Result) and drops the ``wip`` entries; then
    RQ's ``enqueue_dependents`` for the jobs that have dependents, in its two steps: on RQ 3
    each job's dependents moved to the ready registry, then those of the whole batch pushed
    onto their queues at once. No exception handlers, no
    webhooks, no log lines, no rate-limit slots: those cost nothing here on either side.
    """
    registry = StockStartedJobRegistry(QUEUE, connection=conn)
    queue = StockQueue(QUEUE, connection=conn)
    for _ in range(10_000_000):
        expired = conn.zrangebyscore(registry.key, '-inf', current_timestamp(), start=0, num=batch)
        members = [m.decode() for m in expired]
        if not members:
            break
        ids = [member.split(':', 1)[0] for member in members]
        with conn.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(StockJob.key_for(job_id))
                pipe.exists(StockJob.dependents_key_for(job_id))
            replies = pipe.execute()
        failed = []
        for job_id, raw, has_dependents in zip(ids, replies[::2], replies[1::2], strict=True):
            job = StockJob(job_id, connection=conn)
            job.restore(raw)
            if job.get_status(refresh=False) != JobStatus.STARTED:
                continue
            error = AbandonedJobError()
            compat.execute_failure_callback(job, UnixSignalDeathPenalty, AbandonedJobError, error, None)
            failed.append((job, bool(has_dependents)))
        with conn.pipeline() as pipe:
            for job, _ in failed:
                compat.record_job_failure(job, 'Moved to FailedJobRegistry, due to AbandonedJobError', pipe)
            pipe.zrem(registry.key, *members)
            pipe.execute()
        made_ready: dict[str, list[str]] = {}
        for job, has_dependents in failed:
            if has_dependents:
                for target, job_ids in compat.move_dependents_to_ready(queue, job).items():
                    made_ready.setdefault(target, []).extend(job_ids)
        if made_ready:
            queue.enqueue_ready_jobs_by_queue(made_ready)


def cleaner(conn: redis.Redis, case: Case, batch_size: int | None = None) -> Callable[[], Any]:
    """The call that cleans the queue: stock cleanup, or the sweep with the case's settings.

    One sweep finishes at most 1,000 dead letters (their side effects); the rest wait for
    the next sweep. Stock cleanup does every side effect in one call, so the rq-epoch side
    goes on finishing until none is left, and all of that is timed.
    """
    if case.side == STOCK:
        return lambda: StockStartedJobRegistry(QUEUE, connection=conn).cleanup()
    if case.name == DEAD_FLOOR:
        return lambda: fail_like_rq(conn)
    if case.side == FLOOR:
        floor = conn.register_script(FLOOR_SCRIPT)
        batch = batch_size or Sweeper(conn).settings.batch_size
        lease_keys = [keys.leases_key(QUEUE), keys.wip_key(QUEUE)]

        def requeue_all() -> None:
            for _ in range(10_000_000):
                if int(floor(keys=lease_keys, args=[keys.PREFIX, QUEUE, batch])) < batch:
                    break

        return requeue_all
    sweeper = Sweeper(conn, max_stalled=case.max_stalled, restart_grace=0, batch_size=batch_size)

    def sweep() -> None:
        sweeper.sweep([QUEUE])
        for _ in range(MAX_FINISH_ROUNDS):
            if not sweeper.finish_dead_letters():
                break

    return sweep


def check(conn: redis.Redis, case: Case, jobs: JobSet, callbacks: int) -> dict[str, Any]:
    """Where the jobs ended: queued again, or failed with their side effects."""
    n = len(jobs.job_ids)
    queued = conn.llen(keys.queue_key(QUEUE))
    failed = FailedJobRegistry(QUEUE, connection=conn).count
    started_left = conn.zcard(keys.wip_key(QUEUE)) + conn.zcard(keys.leases_key(QUEUE))
    sample = jobs.job_ids[:: max(1, n // 20)]
    raw: list[Any] = [conn.hget(keys.job_key(j), 'status') for j in sample]
    statuses = {s.decode() if isinstance(s, bytes) else s for s in raw}
    if case.requeue:
        expected = {'queued': n, 'failed': 0, 'left_started': 0, 'statuses': ['queued']}
    else:
        results = sum(1 for j in sample if conn.exists(keys.results_key(j)))
        expected = {
            'queued': len(jobs.dependent_ids),
            'failed': n,
            'left_started': 0,
            'statuses': ['failed'],
            'callbacks': n,
            'results_in_sample': len(sample),
        }
    found: dict[str, Any] = {'queued': queued, 'failed': failed, 'left_started': started_left}
    found['statuses'] = sorted(s for s in statuses if s is not None)
    if not case.requeue:
        found['callbacks'] = callbacks
        found['results_in_sample'] = results
    return {'expected': expected, 'found': found}


def run_case(
    conn: redis.Redis,
    case_name: str,
    n: int,
    *,
    batch_size: int | None = None,
    around: Callable[[], AbstractContextManager[Any]] | None = None,
    dependents_every: int = DEPENDENTS_EVERY,
) -> Outcome:
    """Prepare ``n`` expired leases, clean them once (timed, counted), and check the result.

    ``around`` wraps only the timed cleanup (the latency benchmark runs its PING client there).
    """
    case = CASES[case_name]
    jobs = prepare(conn, case, n, dependents_every)
    clean = cleaner(conn, case, batch_size)
    job_functions.FAILURE_CALLBACKS = 0
    conn.config_resetstat()
    before = commandstats(conn)
    with (around or nullcontext)() as probe:
        with count_traffic() as traffic:
            seconds, _ = timed(clean)
    delta = command_delta(before, commandstats(conn))
    scripts_run = conn.info('commandstats').get('cmdstat_evalsha', {})
    checks = check(conn, case, jobs, job_functions.FAILURE_CALLBACKS)
    outcome = Outcome(
        case=case.name,
        side=case.side,
        n=n,
        seconds=seconds,
        round_trips=traffic.round_trips,
        client_commands=traffic.commands,
        server_commands=sum(delta.values()),
        server_commands_top=dict(list(delta.items())[:8]),
        checks=checks,
        ok=checks['expected'] == checks['found'],
    )
    if scripts_run:
        outcome.extra['script_calls'] = int(scripts_run['calls'])
        outcome.extra['script_ms_mean'] = round(float(scripts_run['usec_per_call']) / 1000.0, 3)
        outcome.extra['script_us_per_member'] = round(float(scripts_run['usec']) / n, 2) if n else None
    if probe is not None:
        outcome.extra['during'] = probe
    return outcome


def cases_in_order(names: Iterable[str]) -> list[str]:
    """The cases asked for, in table order: each stock case before the rq-epoch cases it is compared with."""
    order = list(CASES)
    return sorted(set(names), key=order.index)
