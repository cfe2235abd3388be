"""Question 1b: where the sweep's cost above the floor goes, part by part.

:mod:`benchmarks.sweep_vs_cleanup` compares the sweep with a *floor*: a script that does
only the essential writes of an uncounted requeue. This benchmark walks from one to the
other. It takes the sweep script exactly as the sweeper loads it and removes one of its
duties at a time, cumulatively, and measures each variant on the same expired leases
(stamped by another server process, so every one is ``exempt``) with the same batch:

====================  ==========================================================================
step                  what is removed (on top of the steps before it)
====================  ==========================================================================
sweep                 nothing: ``Sweeper.sweep`` as a worker runs it, verdict objects and all
script alone          the client's reading of the reply (the script called in a bare loop)
- reply records       the one-string-per-lease record the sweeper reads
- taken record        the job's ``taken:<execution>`` field, ``exempt_recoveries`` and
                      ``started_at`` in the requeue's HSET
- full read           five of the eight fields read per lease (status, stamp and the holding
                      execution are left)
- primary epoch       ``INFO replication`` and the primaries hash (the grace, the demoted check)
- stock entries       the read of stock workers' expired entries in RQ's registry, and of
                      0.2.0 workers' leases
- counters            the per-queue verdict counters, ``last_sweep`` and the queues set
floor                 :data:`benchmarks.scenarios.FLOOR_SCRIPT`
====================  ==========================================================================

Each variant runs ``--repeat`` times, interleaved with the others in a new random order each
round (``--seed``), and the median is kept.
Server time is the script's own (``INFO commandstats``); wall time includes the round trip.
The variants only exist here: each removes something the product needs (the docs say
what), so the table shows what each duty costs, not a faster sweep.

With ``--interleave`` the variants share one set of expired leases instead: each round calls
every script variant once (one batch each, in a new random order), until the leases run out,
and the server time of every call is read from ``SLOWLOG``; the median call is kept (one call
the machine paused for would move a mean). Every variant then meets the same
data, the same memory and the same neighbours on the machine, so the ratios hold still from run
to run where separate runs of a few hundred milliseconds each move by ±20 %; the client's
reading of the reply (the ``sweep`` step) is not part of it. With two sizes, ``growth`` is each
variant's cost per lease at the larger size over its cost at the smaller. The interleaved
calls include a second floor, ``floor, gathered``: the same writes with those that name one
key for many leases sent once per call, as the sweep sends them (one ZREM of the leases, one of
RQ's registry, one DEL of the execution records, one SREM per worker, one LPUSH); the
``× gathered floor`` column compares with it. A third, ``read and drop``, does less than any
sweep can (per lease, read the job and drop the lease; nothing requeued): how the cost of
walking the lease set and the keyspace grows with N, apart from the writes. Where growth with
N comes from: ``--ballast`` enqueues that many more jobs on another queue before the leases are
swept (a larger data set that no variant reads), and ``--no-aof`` runs the server without its
append-only file.
Growth compares sizes measured one after the other, minutes apart, and this machine's speed
drifts by more than the growth between such minutes; ``--side-by-side`` starts one server per
size and interleaves the calls on all of them, so every size is measured at the same moments
(each size then gets as many calls as the smallest has leases for: the larger sets are
measured on their first leases, with the data set still at its full size).
A set of 10,000 leases gives each of the ten scripts 33 calls; ``--floors-only`` calls only the
script and the two floors (111 calls each), and ``--rounds R`` makes the sets again R times and
pools the calls of every round, for medians that hold still at the smaller size.
``--verdict recovered`` has the script judge a second set of as many leases, stamped by the
running server (each a counted stall with budget left), while the floors requeue the exempt
set: the floor is the same for both verdicts. The steps' edits remove duties of the exempt
verdict, so this option is meant with ``--floors-only``. ``--written-out`` also calls the script
with its common case written out flat (:data:`WRITTEN_OUT`; with ``--floors-only``, beside the
script without its duties, :data:`WITHOUT_DUTIES`): what the script's structure costs, apart
from its duties. ``--specified`` also calls the *specified floor*
(:data:`benchmarks.scenarios.SPECIFIED_FLOOR_SCRIPT`): the floor with the writes that rq-epoch's
specification adds to a requeue (the uncounted-recovery or stall count, the record of a taken
lease), called like the script on the leases the script judges; the ``× specified floor``
column compares with it. It sends one command per write, as the floor does: what the
specification adds to the floor, not the least a sweep can cost (gathering writes saves more).
``--compact`` also calls :data:`benchmarks.scenarios.COMPACT_SCRIPT`: the sweep's reads and
writes for its two requeue verdicts, gathered as the sweep gathers them, in one loop with no
helper functions and no verdict rule for any other lease, called like the script on the leases
the script judges: what the script's commands cost without its structure.

    python -m benchmarks.sweep_anatomy                     # 10,000 leases, 3 repeats
    python -m benchmarks.sweep_anatomy --sizes 10000,100000 --repeat 5
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000,100000
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000 --ballast 90000
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000,100000 --no-aof
    python -m benchmarks.sweep_anatomy --interleave --sizes 20000,200000 --side-by-side
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000 --floors-only --rounds 3
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000 --floors-only --verdict recovered
    python -m benchmarks.sweep_anatomy --interleave --sizes 100000 --floors-only --written-out --specified
    python -m benchmarks.sweep_anatomy --interleave --sizes 10000,100000 --floors-only --rounds 3 --specified --compact
    python -m benchmarks.sweep_anatomy --quick
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import redis

from rq_epoch import Sweeper, keys, scripts
from rq_epoch.settings import EpochSettings

from .common import comma_sizes, parser, quiet_logging, ratio, server, server_version, table, write_results
from .fixture import EPOCH, enqueue_jobs, start_jobs
from .scenarios import (
    CASES,
    FLOOR,
    FLOOR_GATHERED_SCRIPT,
    FLOOR_SCRIPT,
    QUEUE,
    READ_AND_DROP_SCRIPT,
    SPECIFIED_FLOOR_SCRIPT,
    compact_script,
    prepare,
)

NAME = 'sweep_anatomy'
FULL_SIZES = (10_000,)
QUICK_SIZES = (200,)
#: The quick size with --interleave: every variant gets a few full batches.
QUICK_INTERLEAVED_SIZES = (1_000,)
#: Bound on the calls of one variant (each call judges up to a batch).
MAX_CALLS = 1_000_000
#: With --interleave, the SLOWLOG keeps commands slower than this (µs): the script calls.
SLOWLOG_THRESHOLD_US = 50


@dataclass(frozen=True)
class Step:
    """One duty of the sweep script, removed by replacing each ``old`` text with its ``new``."""

    label: str
    edits: tuple[tuple[str, str], ...]


#: The steps, cumulative, in the order of the table in the module docstring.
STEPS: tuple[Step, ...] = (
    Step(
        '- reply records',
        (
            (
                "records[#records + 1] = verdict .. ' ' .. (count_texts[stalled] or count_text(stalled)) .. ' '\n"
                "                          .. (count_texts[max_stalled] or count_text(max_stalled)) .. ' '\n"
                "                          .. (plain_members and member or field(member)) .. ' '\n"
                "                          .. "
                '(epoch_fields[lease_epoch] or epoch_field(lease_epoch))',
                '',
            ),
        ),
    ),
    Step(
        '- taken record',
        (
            (
                "requeue(prefix, queue_key, job_key, job_id, never_started, true, 'exempt_recoveries', "
                "(tonumber(f[6]) or 0) + 1, taken_field, 'exempt')",
                'requeue(prefix, queue_key, job_key, job_id, never_started, true)',
            ),
            (
                "rcall('HSET', job_key, 'status', 'queued', 'started_at', '', ...)",
                "rcall('HSET', job_key, 'status', 'queued')",
            ),
        ),
    ),
    Step(
        '- full read',
        (
            (
                "rpcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled', 'lease_execution',\n"
                "                        'exempt_recoveries', 'stall_epochs')",
                # the job's lease names its execution: lease_execution stays, at the same index
                '(function(r) return {r[1], r[2], false, false, r[3]} end)('
                "rpcall('HMGET', job_key, 'status', 'lease_epoch', 'lease_execution'))",
            ),
        ),
    ),
    Step(
        '- primary epoch',
        (
            (
                'local primary, judges = judging_primary(run_id, uptime, now, prefix, dry)',
                "local primary, judges = {role = 'master', age = 1e9, first = 0, online = 0, expected = 0, "
                'isolated = false, returning = false}, true',
            ),
        ),
    ),
    Step(
        '- stock entries',
        (
            (
                "local stock = members_of(rcall('ZRANGEBYSCORE', wip_key, '-inf', now, 'LIMIT', stock_offset, batch))",
                'local stock = {}',
            ),
            (
                "local legacy_left = rcall('EXISTS', legacy_key) == 1",
                'local legacy_left = false',
            ),
        ),
    ),
    Step(
        '- counters',
        (
            ('  count_verdicts(stats_key)\n', ''),
            ("  rcall('HSET', stats_key, 'last_sweep', tostring(now))\n", ''),
            ("    rcall('SADD', prefix .. ':queues', queue_key)\n", ''),
        ),
    ),
)


#: The flat path of :data:`WRITTEN_OUT`, put before the loop over the leases.
_JUDGE_LEASE = """\
-- The common case of a lease, written out: a job that is started, names its execution and
-- gets exempt or recovered, with no 0.2.0 lease key and the grace over. Anything else is
-- judged by judge() (given what was read).
local function gathered_list(command, key)
  gather(command, key, false)
  local members = gathered[key]
  members[#members] = nil
  return members
end
local lease_drops, entry_drops, pushes
local function judge_lease(member)
  if dry or legacy_left or primary.age < grace or member == '' or find(member, ':', 1, true) then
    return judge(LEASE, member)
  end
  local job_key = prefix .. ':job:' .. member
  local f = rpcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled', 'lease_execution',
                   'exempt_recoveries', 'stall_epochs')
  local exec_id = f[5]
  if f.err or f[1] ~= 'started' or not exec_id then return judge(LEASE, member, f) end
  local epoch = f[2]
  local counted = epoch and epoch == run_id
  local stalled = count_of(f[3], 0, 0)
  local max_stalled = count_of(f[4], 1, default_max)
  if counted and stalled + 1 >= max_stalled then return judge(LEASE, member, f) end
  local rq_member = member .. ':' .. exec_id
  lease_drops[#lease_drops + 1] = member
  entry_drops[#entry_drops + 1] = rq_member
  local execution_key = prefix .. ':execution:' .. rq_member
  local worker_name = rcall('HGET', execution_key, 'worker_name')
  gathered_dels[#gathered_dels + 1] = execution_key
  rcall('ZREM', prefix .. ':executions:' .. member, exec_id)
  if worker_name and worker_name ~= '' then
    gather('SREM', prefix .. ':worker:' .. worker_name .. ':executions', rq_member)
  end
  if counted then
    stalled = stalled + 1
    local epochs = f[7]
    if epochs and epochs ~= '' then epochs = epochs .. ',' .. run_id else epochs = run_id end
    rcall('HSET', job_key, 'status', 'queued', 'started_at', '', 'stalled', stalled, 'stall_epochs', epochs,
          'taken:' .. exec_id, 'recovered')
    pushes[#pushes + 1] = member
    return record(member, 'recovered', stalled, max_stalled, epoch, false)
  end
  rcall('HSET', job_key, 'status', 'queued', 'started_at', '', 'exempt_recoveries', (tonumber(f[6]) or 0) + 1,
        'taken:' .. exec_id, 'exempt')
  pushes[#pushes + 1] = member
  return record(member, 'exempt', stalled, max_stalled, epoch, false)
end

"""

#: ``--written-out``: the script with a second, flat path for the common case (a started lease
#: that gets exempt or recovered, the grace over, no 0.2.0 lease key), as edits of the script
#: like the steps'; everything else still goes to the verdict function, given what was read.
#: It measures what the script's structure costs; the product keeps one verdict function.
WRITTEN_OUT = Step(
    'written out',
    (
        ('local function judge(kind, member)', 'local function judge(kind, member, read)'),
        (
            "  local f = rpcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled', "
            "'lease_execution',",
            "  local f = read or rpcall('HMGET', job_key, 'status', 'lease_epoch', 'stalled', 'max_stalled',\n"
            "                                'lease_execution',",
        ),
        (
            'for _, member in ipairs(leases) do judge(LEASE, member) end',
            _JUDGE_LEASE
            + "lease_drops, entry_drops, pushes = gathered_list('ZREM', leases_key), gathered_list('ZREM', wip_key), "
            "gathered_list('LPUSH', queue_key)\n"
            'for _, member in ipairs(leases) do judge_lease(member) end\n'
            'if #pushes > 0 and not registered[queue_key] then\n'
            "  rcall('SADD', prefix .. ':queues', queue_key)\n"
            '  registered[queue_key] = true\n'
            'end',
        ),
    ),
)
#: With ``--written-out --floors-only``, the step of the anatomy called beside the script: every
#: duty removed but the counters (which the run check of ``--verdict recovered`` reads).
WITHOUT_DUTIES = '- stock entries'


def variants() -> list[tuple[str, str]]:
    """(label, source) of each cumulative variant of the sweep script, starting with the script itself.

    Raises ValueError when an edit no longer matches the script (the script changed: update
    the step), so the table never silently measures the wrong thing.
    """
    source = scripts.sweep().source
    out = [('script alone', source)]
    for step in STEPS:
        source = _edited(source, step)
        out.append((step.label, source))
    return out


def _edited(source: str, step: Step) -> str:
    for old, new in step.edits:
        if source.count(old) != 1:
            raise ValueError(f'step {step.label!r}: expected exactly one {old!r} in sweep.lua')
        source = source.replace(old, new)
    return source


def written_out() -> tuple[str, str]:
    """(label, source) of :data:`WRITTEN_OUT`."""
    return WRITTEN_OUT.label, _edited(scripts.sweep().source, WRITTEN_OUT)


def _bare_loop(conn: redis.Redis, sha: str, n: int) -> Callable[[], int]:
    """Call a sweep variant until it says there is no more: the sweeper's keys and arguments."""
    settings = Sweeper(conn).settings
    keys_ = [
        keys.leases_key(QUEUE),
        keys.wip_key(QUEUE),
        keys.finishing_key(),
        keys.stats_key(QUEUE),
        keys.legacy_leases_key(QUEUE),
    ]
    args = [keys.PREFIX, QUEUE, settings.batch_size, settings.max_stalled, 0, 86400, '0', 0, 0, 0]

    def run() -> int:
        calls = 0
        for _ in range(MAX_CALLS):
            calls += 1
            reply = conn.evalsha(sha, len(keys_), *keys_, *args)
            if int(reply[8]) == 0:
                break
        return calls

    return run


def _floor_loop(conn: redis.Redis, sha: str) -> Callable[[], int]:
    batch = Sweeper(conn).settings.batch_size
    keys_ = [keys.leases_key(QUEUE), keys.wip_key(QUEUE)]

    def run() -> int:
        calls = 0
        for _ in range(MAX_CALLS):
            calls += 1
            if int(conn.evalsha(sha, len(keys_), *keys_, keys.PREFIX, QUEUE, batch)) < batch:
                break
        return calls

    return run


def _sweeper_loop(conn: redis.Redis) -> Callable[[], int]:
    sweeper = Sweeper(conn, restart_grace=0)

    def run() -> int:
        return sweeper.sweep([QUEUE]).total

    return run


def measure(conn: redis.Redis, label: str, n: int) -> dict[str, Any]:
    """Prepare ``n`` exempt leases, clean them with one variant, and time it."""
    jobs = prepare(conn, CASES[FLOOR if label == 'floor' else 'exempt'], n)
    if label == 'sweep':
        run = _sweeper_loop(conn)
    elif label == 'floor':
        run = _floor_loop(conn, conn.script_load(FLOOR_SCRIPT))
    else:
        run = _bare_loop(conn, conn.script_load(dict(variants())[label]), n)
    conn.config_resetstat()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    stats = conn.info('commandstats').get('cmdstat_evalsha', {})
    left = conn.zcard(keys.leases_key(QUEUE))
    queued = conn.llen(keys.queue_key(QUEUE))
    return {
        'label': label,
        'n': n,
        'wall_us_per_lease': seconds / n * 1e6,
        'server_us_per_lease': float(stats.get('usec', 0)) / n,
        'calls': int(stats.get('calls', 0)),
        'ok': left == 0 and queued == len(jobs.job_ids),
    }


def run(kind: str, sizes: tuple[int, ...], repeat: int, seed: int = 0) -> dict[str, Any]:
    labels = ['sweep', *(label for label, _ in variants()), 'floor']
    rows: list[dict[str, Any]] = []
    with server(kind) as srv:
        conn = srv.client()
        version = server_version(conn)
        for n in sizes:
            samples: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
            order = random.Random(seed)
            for _ in range(repeat):
                # A new order each round, so that no step always follows the same one.
                for label in order.sample(labels, len(labels)):
                    samples[label].append(measure(conn, label, n))
            floor_wall = statistics.median(s['wall_us_per_lease'] for s in samples['floor'])
            floor_server = statistics.median(s['server_us_per_lease'] for s in samples['floor'])
            previous: dict[str, Any] | None = None
            for label in labels:
                wall = statistics.median(s['wall_us_per_lease'] for s in samples[label])
                srv_us = statistics.median(s['server_us_per_lease'] for s in samples[label])
                row = {
                    'n': n,
                    'step': label,
                    'wall_us_per_lease': round(wall, 2),
                    'server_us_per_lease': round(srv_us, 2),
                    'wall_saved_us': round(previous['wall_us_per_lease'] - wall, 2) if previous else None,
                    'server_saved_us': round(previous['server_us_per_lease'] - srv_us, 2)
                    if previous and label != 'script alone'
                    else None,
                    'wall_vs_floor': ratio(wall, floor_wall),
                    'server_vs_floor': ratio(srv_us, floor_server),
                    'runs_wall_us': [round(s['wall_us_per_lease'], 2) for s in samples[label]],
                    'ok': all(s['ok'] for s in samples[label]),
                }
                rows.append(row)
                previous = row
    return {'server': version, 'repeat': repeat, 'seed': seed, 'rows': rows}


#: The label of the floor that sends its writes the way the sweep does (FLOOR_GATHERED_SCRIPT).
GATHERED_FLOOR = 'floor, gathered'
#: The label of SPECIFIED_FLOOR_SCRIPT (``--specified``): the floor with the writes the
#: specification adds, called like the script, on the leases the script judges.
SPECIFIED_FLOOR = 'floor, specified'
#: The label of COMPACT_SCRIPT (``--compact``): the sweep's duties for its requeue verdicts in one
#: compact loop, called like the script, on the leases the script judges.
COMPACT = 'compact'
#: The label of READ_AND_DROP_SCRIPT: less than any sweep does (read each job, drop each lease).
READ_AND_DROP = 'read and drop'
#: Variants called like the floor (KEYS: leases, wip; ARGV: prefix, queue, batch).
FLOOR_LIKE = ('floor', GATHERED_FLOOR, READ_AND_DROP)
#: Queue of the jobs that ``--ballast`` adds (enqueued, never started: no sweep reads them).
BALLAST_QUEUE = 'ballast'
#: With ``verdict='recovered'``: the queue of the leases the script variants judge (stamped by
#: the running server, each a counted stall with budget left); the floors keep :data:`QUEUE`.
RECOVERED_QUEUE = 'recovered'
VERDICTS = ('exempt', 'recovered')


def _interleaved(conn: redis.Redis, n: int, seed: int, ballast: int = 0, **options: Any) -> list[dict[str, Any]]:
    """One set of ``n`` expired leases, every variant called in turn, a batch per call, until they run out.

    ``ballast`` more jobs are enqueued on another queue first: a larger data set that no
    variant reads."""
    return _interleaved_sets({n: conn}, seed, ballast, **options)


def _sources(
    floors_only: bool = False, with_written_out: bool = False, with_specified: bool = False, with_compact: bool = False
) -> list[tuple[str, str]]:
    """(label, source) of every script an interleaved run calls: the variants and the floors.

    With ``with_written_out``, :data:`WRITTEN_OUT` after the script's variants (and, with
    ``floors_only``, the :data:`WITHOUT_DUTIES` step beside it); with ``with_compact``,
    :data:`COMPACT` after them; with ``with_specified``, :data:`SPECIFIED_FLOOR` before the floor."""
    extra = [written_out()] if with_written_out else []
    if floors_only and with_written_out:
        extra += [v for v in variants() if v[0] == WITHOUT_DUTIES]
    if with_compact:
        extra.append((COMPACT, compact_script()))
    if with_specified:
        extra.append((SPECIFIED_FLOOR, SPECIFIED_FLOOR_SCRIPT))
    if floors_only:
        return [variants()[0], *extra, ('floor', FLOOR_SCRIPT), (GATHERED_FLOOR, FLOOR_GATHERED_SCRIPT)]
    return [
        *variants(),
        *extra,
        ('floor', FLOOR_SCRIPT),
        (GATHERED_FLOOR, FLOOR_GATHERED_SCRIPT),
        (READ_AND_DROP, READ_AND_DROP_SCRIPT),
    ]


def _interleaved_sets(
    conns: dict[int, redis.Redis],
    seed: int,
    ballast: int = 0,
    *,
    rounds: int = 1,
    floors_only: bool = False,
    verdict: str = 'exempt',
    with_written_out: bool = False,
    with_specified: bool = False,
    with_compact: bool = False,
) -> list[dict[str, Any]]:
    """One set of expired leases per entry of ``conns`` (size: a server of its own), every
    variant on every set called in turn, a batch per call, until one set runs out; ``rounds``
    times, each on sets made again, the calls of every round pooled. With ``verdict`` 'recovered'
    the script variants judge a second set of as many leases, stamped by the running server."""
    batch = Sweeper(next(iter(conns.values()))).settings.batch_size
    sources = _sources(floors_only, with_written_out, with_specified, with_compact)
    labels = [label for label, _ in sources]
    walls: dict[tuple[int, str], list[float]] = {(n, label): [] for n in conns for label in labels}
    servers: dict[int, dict[str, list[int]]] = {n: {label: [] for label in labels} for n in conns}
    ok = dict.fromkeys(conns, True)
    order = random.Random(seed)
    for _ in range(rounds):
        _one_round(conns, sources, batch, ballast, order, walls, servers, ok, verdict)
    rows = []
    for n in conns:
        floor_server = statistics.median(servers[n]['floor']) / batch
        floor_wall = statistics.median(walls[(n, 'floor')]) / batch * 1e6
        gathered_server = statistics.median(servers[n][GATHERED_FLOOR]) / batch
        specified_server = statistics.median(servers[n][SPECIFIED_FLOOR]) / batch if with_specified else None
        for label in labels:
            server_us = statistics.median(servers[n][label]) / batch
            wall_us = statistics.median(walls[(n, label)]) / batch * 1e6
            rows.append(
                {
                    'n': n,
                    'ballast': ballast,
                    'rounds': rounds,
                    'verdict': verdict,
                    'step': label,
                    'calls': len(servers[n][label]),
                    'wall_us_per_lease': round(wall_us, 2),
                    'server_us_per_lease': round(server_us, 2),
                    'wall_vs_floor': ratio(wall_us, floor_wall),
                    'server_vs_floor': ratio(server_us, floor_server),
                    'server_vs_gathered_floor': ratio(server_us, gathered_server),
                    'server_vs_specified_floor': ratio(server_us, specified_server) if specified_server else None,
                    'ok': ok[n] and len(servers[n][label]) == len(walls[(n, label)]),
                }
            )
    return rows


def _one_round(
    conns: dict[int, redis.Redis],
    sources: list[tuple[str, str]],
    batch: int,
    ballast: int,
    order: random.Random,
    walls: dict[tuple[int, str], list[float]],
    servers: dict[int, dict[str, list[int]]],
    ok: dict[int, bool],
    verdict: str = 'exempt',
) -> None:
    """Make every set, call every variant on every set in turn until one set runs out, and add
    each call's wall and server time to ``walls`` / ``servers``; ``ok[n]`` turns false when a
    set's jobs did not end where they should."""
    calls: dict[tuple[int, str], Callable[[], Any]] = {}
    sha_labels: dict[int, dict[str, str]] = {}
    script_queue = RECOVERED_QUEUE if verdict == 'recovered' else QUEUE
    for n, conn in conns.items():
        prepare(conn, CASES[FLOOR], n)
        if script_queue != QUEUE:
            start_jobs(conn, enqueue_jobs(conn, script_queue, n, retry=True, on_failure=True), EPOCH)
        if ballast:
            enqueue_jobs(conn, BALLAST_QUEUE, ballast)
        sha_labels[n] = {}
        for label, source in sources:
            loaded = conn.script_load(source)
            sha = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
            sha_labels[n][sha] = label
            floor = label in FLOOR_LIKE
            calls[(n, label)] = _one_call(conn, sha, floor, batch, QUEUE if floor else script_queue)
    lease_sets = sorted({QUEUE, script_queue})
    dropped = dict.fromkeys(conns, 0)  # leases READ_AND_DROP removed without requeueing
    previous = {n: conn.config_get('slowlog-*') for n, conn in conns.items()}
    try:
        for conn in conns.values():
            # The server logs the commands a script runs too: only calls slower than this are
            # kept, which every call of a full batch is (hundreds of µs), and none of the single
            # commands in it should be. Each variant must end with one entry per call (`ok`).
            conn.config_set('slowlog-log-slower-than', SLOWLOG_THRESHOLD_US)
            conn.config_set('slowlog-max-len', 1_024)
            conn.slowlog_reset()
        for _ in range(MAX_CALLS):
            if any(
                int(conn.zcard(keys.leases_key(queue))) < batch * len(sources)
                for conn in conns.values()
                for queue in lease_sets
            ):
                break
            for key in order.sample(list(calls), len(calls)):
                start = time.perf_counter()
                result = calls[key]()
                walls[key].append(time.perf_counter() - start)
                if key[1] == READ_AND_DROP:
                    dropped[key[0]] += int(result)
            for n, conn in conns.items():
                _read_slowlog(conn, sha_labels[n], servers[n])
    finally:
        for n, conn in conns.items():
            conn.config_set('slowlog-log-slower-than', previous[n]['slowlog-log-slower-than'])
            conn.config_set('slowlog-max-len', previous[n]['slowlog-max-len'])
    for n, conn in conns.items():
        for queue in lease_sets:
            left = int(conn.zcard(keys.leases_key(queue)))
            gone = dropped[n] if queue == QUEUE else 0
            ok[n] = ok[n] and int(conn.llen(keys.queue_key(queue))) + gone == n - left
        ok[n] = ok[n] and int(conn.llen(keys.queue_key(BALLAST_QUEUE))) == ballast
        if script_queue != QUEUE:  # every lease the script judged was a counted stall
            counts = conn.hgetall(keys.stats_key(script_queue))
            judged = n - int(conn.zcard(keys.leases_key(script_queue)))
            ok[n] = ok[n] and counts == {b'recovered': str(judged).encode(), b'last_sweep': counts.get(b'last_sweep')}


def _read_slowlog(conn: redis.Redis, sha_label: dict[str, str], servers: dict[str, list[int]]) -> None:
    """Move the script calls of the server's SLOWLOG into ``servers`` (µs per call, by variant)."""
    for entry in conn.slowlog_get(-1):
        command = entry['command']
        words = (command.decode() if isinstance(command, bytes) else command).split()
        if len(words) > 1 and words[0].upper() == 'EVALSHA' and words[1] in sha_label:
            servers[sha_label[words[1]]].append(int(entry['duration']))
    conn.slowlog_reset()


def _one_call(conn: redis.Redis, sha: str, floor: bool, batch: int, queue: str = QUEUE) -> Callable[[], Any]:
    if floor:
        floor_keys = [keys.leases_key(queue), keys.wip_key(queue)]
        return lambda: conn.evalsha(sha, len(floor_keys), *floor_keys, keys.PREFIX, queue, batch)
    sweep_keys = [
        keys.leases_key(queue),
        keys.wip_key(queue),
        keys.finishing_key(),
        keys.stats_key(queue),
        keys.legacy_leases_key(queue),
    ]
    args = [keys.PREFIX, queue, batch, 3, 0, 86400, '0', 0, 0, 0]
    return lambda: conn.evalsha(sha, len(sweep_keys), *sweep_keys, *args)


def least_interleaved(
    floors_only: bool = False, with_written_out: bool = False, with_specified: bool = False, with_compact: bool = False
) -> int:
    """The fewest leases that give every variant two full batches with ``--interleave``."""
    sources = _sources(floors_only, with_written_out, with_specified, with_compact)
    return 2 * EpochSettings.resolve().batch_size * len(sources)


def _settings(conn: redis.Redis, names: dict[str, str] | None) -> dict[str, str]:
    """The server's own value of each setting named in ``names`` (``--server-config``), read back."""
    return {name: str(conn.config_get(name).get(name, '')) for name in names or {}}


def run_interleaved(
    kind: str,
    sizes: tuple[int, ...],
    seed: int = 0,
    *,
    ballast: int = 0,
    aof: bool = True,
    side_by_side: bool = False,
    rounds: int = 1,
    floors_only: bool = False,
    verdict: str = 'exempt',
    server_config: dict[str, str] | None = None,
    with_written_out: bool = False,
    with_specified: bool = False,
    with_compact: bool = False,
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    config = {} if aof else {'appendonly': 'no'}
    config.update(server_config or {})
    options: dict[str, Any] = {
        'rounds': rounds,
        'floors_only': floors_only,
        'verdict': verdict,
        'with_written_out': with_written_out,
        'with_specified': with_specified,
        'with_compact': with_compact,
    }
    if side_by_side:
        with ExitStack() as stack:
            conns = {n: stack.enter_context(server(kind, **config)).client() for n in sizes}
            version = server_version(conns[sizes[0]])
            applied = _settings(conns[sizes[0]], server_config)
            rows = _interleaved_sets(conns, seed, ballast, **options)
    else:
        with server(kind, **config) as srv:
            conn = srv.client()
            version = server_version(conn)
            applied = _settings(conn, server_config)
            for n in sizes:
                rows.extend(_interleaved(conn, n, seed, ballast, **options))
    first = {r['step']: r['server_us_per_lease'] for r in rows if r['n'] == sizes[0]}
    for r in rows:
        r['growth'] = ratio(r['server_us_per_lease'], first[r['step']]) if r['n'] != sizes[0] else None
    return {
        'server': version,
        'interleave': True,
        'side_by_side': side_by_side,
        'seed': seed,
        'ballast': ballast,
        'aof': aof,
        'rounds': rounds,
        'floors_only': floors_only,
        'written_out': with_written_out,
        'specified': with_specified,
        'compact': with_compact,
        'verdict': verdict,
        'server_config': applied,
        'rows': rows,
    }


#: The columns of the --interleave table: (heading, key of a row).
INTERLEAVED_COLUMNS = (
    ('N', 'n'),
    ('step', 'step'),
    ('calls', 'calls'),
    ('server µs/lease', 'server_us_per_lease'),
    ('server × floor', 'server_vs_floor'),
    ('server × gathered floor', 'server_vs_gathered_floor'),
    ('server × specified floor', 'server_vs_specified_floor'),
    ('growth', 'growth'),
    ('wall µs/lease', 'wall_us_per_lease'),
    ('wall × floor', 'wall_vs_floor'),
    ('ok', 'ok'),
)


def render_interleaved(rows: list[dict[str, Any]]) -> str:
    """The --interleave table; the specified floor's column only when it was called."""
    columns = [
        (heading, key)
        for heading, key in INTERLEAVED_COLUMNS
        if key != 'server_vs_specified_floor' or any(r.get(key) is not None for r in rows)
    ]
    return table([heading for heading, _ in columns], [[r.get(key) for _, key in columns] for r in rows])


def render(rows: list[dict[str, Any]]) -> str:
    headers = [
        'N',
        'step',
        'wall µs/lease',
        'saved',
        'server µs/lease',
        'saved',
        'wall × floor',
        'server × floor',
        'ok',
    ]
    body = [
        [
            r['n'],
            r['step'],
            r['wall_us_per_lease'],
            r['wall_saved_us'],
            r['server_us_per_lease'],
            r['server_saved_us'],
            r['wall_vs_floor'],
            r['server_vs_floor'],
            r['ok'],
        ]
        for r in rows
    ]
    return table(headers, body)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--sizes', type=comma_sizes, default=None, help='comma-separated sizes (default 10000; quick 200)')
    p.add_argument(
        '--repeat',
        type=int,
        default=None,
        help='runs of each step, interleaved; the median is kept (default 3; quick 1)',
    )
    p.add_argument('--seed', type=int, default=0, help='seed of the order of the steps in each round (default 0)')
    p.add_argument(
        '--interleave',
        action='store_true',
        help='call the script variants in turn on one set of leases; server time per call from SLOWLOG',
    )
    p.add_argument(
        '--ballast',
        type=int,
        default=0,
        help='with --interleave: enqueue this many more jobs on another queue first (a larger data set no sweep reads)',
    )
    p.add_argument(
        '--no-aof',
        action='store_true',
        help='with --interleave: run the server without its append-only file (default: appendonly yes, everysec)',
    )
    p.add_argument(
        '--side-by-side',
        action='store_true',
        help='with --interleave and two or more sizes: one server per size, and their calls interleaved too '
        '(each size gets as many calls as the smallest has leases for)',
    )
    p.add_argument(
        '--rounds',
        type=int,
        default=1,
        help='with --interleave: make the sets of leases again this many times and pool the calls (default 1)',
    )
    p.add_argument(
        '--floors-only',
        action='store_true',
        help='with --interleave: call only the script and the two floors (more calls each from the same leases)',
    )
    p.add_argument(
        '--verdict',
        choices=VERDICTS,
        default='exempt',
        help='with --interleave: the verdict of the leases the script judges (default exempt); with recovered, '
        'a second set of as many leases, stamped by the running server, while the floors keep the exempt set',
    )
    p.add_argument(
        '--written-out',
        action='store_true',
        help='with --interleave: also call the script with its common case written out flat (and, with '
        "--floors-only, the script without its duties): what the script's structure costs",
    )
    p.add_argument(
        '--specified',
        action='store_true',
        help='with --interleave: also call the floor with the writes the specification adds (the uncounted-recovery '
        'and stall counts, the record of a taken lease), on the leases the script judges',
    )
    p.add_argument(
        '--compact',
        action='store_true',
        help="with --interleave: also call the sweep's duties for its requeue verdicts written as one compact loop "
        '(no verdict rule for other leases): what a script with the same commands and none of the structure costs',
    )
    p.add_argument(
        '--server-config',
        action='append',
        default=[],
        metavar='NAME=VALUE',
        help='with --interleave: one more setting of the server (repeatable), e.g. hash-max-listpack-entries=0',
    )
    args = p.parse_args(argv)
    quiet_logging()
    interleave_only = (
        (args.ballast or args.no_aof or args.side_by_side or args.rounds != 1 or args.floors_only)
        or args.verdict != 'exempt'
        or bool(args.server_config)
        or args.written_out
        or args.specified
        or args.compact
    )
    if interleave_only and not args.interleave:
        p.error(
            '--ballast, --no-aof, --side-by-side, --rounds, --floors-only, --verdict, --written-out, --specified, '
            '--compact and --server-config apply to --interleave only'
        )
    server_config = {}
    for setting in args.server_config:
        name, sep, value = setting.partition('=')
        if not sep or not name:
            p.error(f'--server-config takes NAME=VALUE, got {setting!r}')
        server_config[name] = value
    if args.rounds < 1:
        p.error(f'--rounds must be 1 or more, got {args.rounds}')
    if args.ballast < 0:
        p.error(f'--ballast must be 0 or more, got {args.ballast}')
    if args.interleave:
        if args.repeat is not None:
            p.error('--repeat does not apply to --interleave: every variant is called until the leases run out')
        sizes = args.sizes or (QUICK_INTERLEAVED_SIZES if args.quick else FULL_SIZES)
        least = least_interleaved(args.floors_only, args.written_out, args.specified, args.compact)
        if min(sizes) < least:
            p.error(f'--interleave needs at least {least} leases per size (two batches per variant)')
        if args.side_by_side and (len(sizes) < 2 or len(set(sizes)) != len(sizes)):
            p.error('--side-by-side needs two or more different sizes')
        result = run_interleaved(
            args.server,
            sizes,
            args.seed,
            ballast=args.ballast,
            aof=not args.no_aof,
            side_by_side=args.side_by_side,
            rounds=args.rounds,
            floors_only=args.floors_only,
            verdict=args.verdict,
            server_config=server_config,
            with_written_out=args.written_out,
            with_specified=args.specified,
            with_compact=args.compact,
        )
        print(render_interleaved(result['rows']))
        write_results(NAME, {'quick': args.quick, **result}, args.out)
        return 0 if all(r['ok'] for r in result['rows']) else 1
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    repeat = args.repeat or (1 if args.quick else 3)
    result = run(args.server, sizes, repeat, args.seed)
    print(render(result['rows']))
    write_results(NAME, {'quick': args.quick, **result}, args.out)
    return 0 if all(r['ok'] for r in result['rows']) else 1


if __name__ == '__main__':
    raise SystemExit(main())
