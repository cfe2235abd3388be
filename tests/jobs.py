"""Job functions run by real workers in the tests (importable as ``tests.jobs``)."""

from __future__ import annotations

import os
import signal
import time


def record(path: str, tag: str) -> None:
    with open(path, 'a', encoding='utf-8') as fh:
        fh.write(f'{tag} {os.getpid()}\n')


def add(a: int, b: int) -> int:
    return a + b


def sleep_and_record(path: str, tag: str, seconds: float) -> str:
    """Record the start, sleep, record the end: executions are counted from the file."""
    record(path, f'start {tag}')
    time.sleep(seconds)
    record(path, f'end {tag}')
    return tag


def wait_for_file_then_record(path: str, tag: str, release: str, limit: float = 120.0) -> str:
    """Run until ``release`` exists (bounded by ``limit`` seconds)."""
    record(path, f'start {tag}')
    deadline = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    record(path, f'end {tag}')
    return tag


def fail_after_file(path: str, tag: str, release: str, limit: float = 120.0) -> None:
    wait_for_file_then_record(path, tag, release, limit)
    raise RuntimeError(f'{tag} failed on purpose')


def poison_pill(path: str, tag: str) -> None:
    """Take the whole worker down, worker process and work-horse, as an OOM kill would."""
    record(path, f'start {tag}')
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def on_failure_record(job, connection, typ, value, tb) -> None:  # noqa: ANN001 - RQ's callback signature
    connection.rpush(f'test:on_failure:{job.id}', f'{typ.__name__}: {value}')


def gated(path: str, tag: str, release: str, first_run: str = 'return', limit: float = 120.0) -> object:
    """Run until ``release`` exists. The first run ends as ``first_run`` says (``return``,
    ``raise``, or ``retry``: return ``rq.Retry``); later runs return ``tag``."""
    first = not os.path.exists(path)
    wait_for_file_then_record(path, tag, release, limit)
    if first and first_run == 'raise':
        raise RuntimeError(f'{tag} failed on purpose')
    if first and first_run == 'retry':
        from rq import Retry

        return Retry(max=2)
    return tag


def on_success_record(job, connection, result) -> None:  # noqa: ANN001 - RQ's callback signature
    connection.rpush(f'test:on_success:{job.id}', str(result))


def describe_current_job() -> str:
    """The class of the job object the worker runs, as the job itself sees it."""
    from rq import get_current_job

    from rq_epoch import EpochJobMixin
    from tests.jobclasses import TracedJob

    job = get_current_job()
    cls = type(job)
    flags = f'epoch={isinstance(job, EpochJobMixin)} traced={isinstance(job, TracedJob)}'
    return f'{cls.__module__}.{cls.__qualname__} {flags}'


def raise_connection_error() -> None:
    """A job function whose own error is a redis-py ConnectionError."""
    import redis

    raise redis.exceptions.ConnectionError('raised by the job function')


def on_success_record_file(job, connection, result) -> None:  # noqa: ANN001 - RQ's callback signature
    """Record the callback in ``<the job's path argument>.callback``."""
    record(f'{job.args[0]}.callback', f'on_success {job.id}')


def on_failure_record_file(job, connection, typ, value, tb) -> None:  # noqa: ANN001 - RQ's callback signature
    """Record the callback in ``<the job's path argument>.callback``."""
    record(f'{job.args[0]}.callback', f'on_failure {job.id}')
