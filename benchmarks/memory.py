"""How much server memory does rq-epoch add per running job?

N jobs are put in the started state a stock worker leaves; MEMORY USAGE (every element
counted: ``SAMPLES 0``) is taken of each job hash and of RQ's ``rq:wip`` set. Then, for
the same jobs, the real grant script runs (as ``rq_epoch.Worker`` runs it when it starts
a job: the lease entry and the ``lease_epoch``/``lease_execution`` stamp) and ``rq:wip``
gets rq-epoch's ``+inf`` score; the same measures again, plus rq-epoch's lease set. Two
job shapes: a job without arguments (a small job hash, kept as a listpack) and one with
a 200-byte argument (a job hash kept as a hash table); two sizes, since a small sorted
set is a listpack and a large one a skiplist.

    python -m benchmarks.memory          # N = 100 and 10,000
    python -m benchmarks.memory --quick  # N = 20 and 300
"""

from __future__ import annotations

from typing import Any

import redis

from rq_epoch.protocol import keys, scripts

from .fixture import CHUNK, EPOCH_TTL, enqueue_jobs, start_jobs
from .harness import STOCK, parser, server, server_version
from .report import finish

NAME = 'memory'
QUEUE = 'mem'
TARGET_BYTES = 256
SHAPES: dict[str, tuple[str, tuple[Any, ...]]] = {
    'no arguments': ('benchmarks.jobs.noop', ()),
    '200-byte argument': ('benchmarks.jobs.noop_with', ('x' * 200,)),
}


def usage(conn: redis.Redis, names: list[str]) -> int:
    """Sum of MEMORY USAGE over ``names`` (every element counted)."""
    total = 0
    for start in range(0, len(names), CHUNK):
        with conn.pipeline(transaction=False) as pipe:
            for name in names[start : start + CHUNK]:
                pipe.memory_usage(name, samples=0)
            total += sum(x or 0 for x in pipe.execute())
    return total


def used_memory(conn: redis.Redis) -> int:
    return int(conn.info('memory')['used_memory'])


def grant_all(conn: redis.Redis, members: list[str]) -> None:
    """What ``rq_epoch.Worker`` adds when it starts each job: RQ's entry at +inf, and the grant script.

    ``members`` are RQ's names of the executions, ``<job_id>:<execution_id>``; the lease's member is the job id.
    """
    grant = scripts.grant()
    for start in range(0, len(members), CHUNK):
        with conn.pipeline(transaction=False) as pipe:
            for member in members[start : start + CHUNK]:
                job_id, execution_id = member.split(':', 1)
                pipe.zadd(keys.wip_key(QUEUE), {member: '+inf'})
                grant.queue(pipe, [keys.leases_key(QUEUE), keys.job_key(job_id)], [job_id, EPOCH_TTL, execution_id])
            pipe.execute()


def measure(conn: redis.Redis, shape: str, n: int) -> dict[str, Any]:
    """Bytes per job before and after rq-epoch's additions, for ``n`` running jobs of ``shape``."""
    func, args = SHAPES[shape]
    conn.flushall()
    scripts.load_all(conn)  # the script cache is not per job
    jobs = enqueue_jobs(conn, QUEUE, n, on_failure=False, func=func, args=args)
    members = start_jobs(conn, jobs, STOCK, expired=False)
    job_keys = [keys.job_key(j) for j in jobs.job_ids]
    hashes_before = usage(conn, job_keys)
    wip_before = usage(conn, [keys.wip_key(QUEUE)])
    used_before = used_memory(conn)
    encoding_before = conn.object('encoding', job_keys[0])
    grant_all(conn, members)
    hashes_after = usage(conn, job_keys)
    wip_after = usage(conn, [keys.wip_key(QUEUE)])
    leases = usage(conn, [keys.leases_key(QUEUE)])
    used_after = used_memory(conn)
    added = (hashes_after - hashes_before) + (wip_after - wip_before) + leases
    return {
        'shape': shape,
        'n': n,
        'job_hash_encoding': _text(encoding_before),
        'job_hash_bytes_before': round(hashes_before / n, 1),
        'job_hash_bytes_added': round((hashes_after - hashes_before) / n, 1),
        'wip_bytes_added': round((wip_after - wip_before) / n, 1),
        'lease_set_bytes': round(leases / n, 1),
        'lease_set_encoding': _text(conn.object('encoding', keys.leases_key(QUEUE))),
        'added_bytes_per_job': round(added / n, 1),
        'used_memory_delta_per_job': round((used_after - used_before) / n, 1),
        'target_met': added / n <= TARGET_BYTES,
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    sizes = (20, 300) if args.quick else (100, 10_000)
    with server(args.server) as srv:
        conn = srv.client()
        rows = [measure(conn, shape, n) for shape in SHAPES for n in sizes]
        return finish(NAME, {'quick': args.quick, 'server': server_version(conn), 'rows': rows}, args.out, True, conn)


if __name__ == '__main__':
    raise SystemExit(main())
