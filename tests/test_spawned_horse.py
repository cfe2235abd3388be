"""A server restart while a spawned work-horse starts costs the job nothing.

``rq_epoch.SpawnWorker``'s work-horse is a new process: before the job starts it reads the
worker, the job and the execution from the server. A loopback proxy holds its first read
(``EXISTS`` of the worker's key) while the server is shut down and started again on the same
data folder, so the work-horse meets the outage there and nowhere else. rq-epoch's work-horse
reads again once the server is back: the job runs once, its retry unspent, no failure. (RQ's
own SpawnWorker's work-horse dies there with a connection error; at a restart stock RQ's
worker itself quits, see ``test_restart_ride_through.py``, so there is no stock run here.)
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Callback, Retry
from rq.job import JobStatus

from rq_epoch import ConfigurationError, Job, Queue, SpawnWorker
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.worker.flavours import connection_spec, rebuild_connection
from tests.conftest import wait_for

ON_FAILURE = Callback('tests.jobs.on_failure_record')


def _first_read_of(worker_name: str) -> bytes:
    """The bytes of ``EXISTS rq:worker:<name>``: the spawned work-horse's first read."""
    key = f'rq:worker:{worker_name}'
    return f'$6\r\nEXISTS\r\n${len(key)}\r\n{key}\r\n'.encode()


def _held_at_the_first_read(start_worker, proxy, conn, queue_name: str, log: Path):
    """A SpawnWorker through the proxy, and a job whose work-horse's first read is held there."""
    name = f'spawner-{uuid.uuid4().hex[:8]}'
    worker = start_worker(queue_name, worker_class='rq_epoch.SpawnWorker', url=proxy.url, args=['--name', name])
    queue = Queue(queue_name, connection=conn)
    # The worker's first maintenance also sends EXISTS of its own key (RQ's cleaning of the
    # worker registry): hold only after it, once the maintenance lock is released.
    wait_for(lambda: 'cleaning registries' in worker.output(), 30, what="the worker's first maintenance")
    wait_for(lambda: not conn.exists(queue.registry_cleaning_key), 30, what='the maintenance done')
    proxy.hold(_first_read_of(name))
    job = queue.enqueue('tests.jobs.record', str(log), 'ran', retry=Retry(max=1), on_failure=ON_FAILURE)
    assert proxy.held.wait(30), "the work-horse's first read never came"
    return worker, job


def _ran_once_unharmed(conn, job: Job, log: Path, worker) -> None:
    """The job finished, its function ran once; no failure callback, no retry spent, uncounted."""
    wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 40, what='the job finished')
    job = Job.fetch(job.id, connection=conn)
    assert log.read_text().count('ran ') == 1
    assert job.retries_left == 1 and conn.lrange(f'test:on_failure:{job.id}', 0, -1) == []
    assert [r.type.name for r in job.results()] == ['SUCCESSFUL']
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert 'Work-horse terminated' not in worker.output()
    assert worker.proc.poll() is None


def test_a_restart_while_the_spawned_work_horse_starts_neither_fails_nor_retries_the_job(
    server, proxy, start_worker, tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    old_run_id = server.run_id()
    worker, job = _held_at_the_first_read(start_worker, proxy, server.client(), 'spawn-outage', log)
    server.stop()
    proxy.release()
    wait_for(lambda: 'before job' in worker.output(), 30, what='the work-horse meeting the outage')
    server.start()
    assert server.run_id() != old_run_id
    _ran_once_unharmed(server.client(), job, log, worker)
    assert f'server unreachable before job {job.id} started' in worker.output()
    # The work-horse logs as the worker does; its line comes after the outcome it reports.
    wait_for(lambda: f'Job OK ({job.id})' in worker.output(), 30, what="the work-horse's 'Job OK' line")


@pytest.fixture
def unix_server() -> Iterator[EmbeddedServer]:
    """A Valkey server that also listens on a Unix socket (a short path: sockets have a limit)."""
    folder = Path(tempfile.mkdtemp(prefix='rqe-'))
    srv = EmbeddedServer('valkey', data_dir=folder / 'data', extra_config={'unixsocket': str(folder / 's.sock')})
    srv.start()
    try:
        yield srv
    finally:
        srv.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_spawned_work_horse_connects_over_the_workers_unix_socket(unix_server, start_worker, tmp_path: Path) -> None:
    socket_path = unix_server.extra_config['unixsocket']
    conn = redis.Redis(unix_socket_path=socket_path)
    log = tmp_path / 'log'
    job = Queue('unix', connection=conn).enqueue('tests.jobs.record', str(log), 'ran')
    worker = start_worker('unix', worker_class='rq_epoch.SpawnWorker', url=f'unix://{socket_path}?db=0', burst=True)
    wait_for(lambda: worker.proc.poll() is not None, 60, what='the burst worker done')
    assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.FINISHED, worker.output()
    assert log.read_text().count('ran ') == 1


def test_a_connection_a_work_horse_cannot_be_given_is_refused_when_the_worker_starts(conn) -> None:
    class LocalConnection(redis.Connection):  # a local class: another process cannot import it
        pass

    port = conn.connection_pool.connection_kwargs['port']
    pool = redis.ConnectionPool(connection_class=LocalConnection, host='127.0.0.1', port=port)
    client = redis.Redis(connection_pool=pool)
    worker = SpawnWorker(['refused'], connection=client)
    with pytest.raises(ConfigurationError, match='SpawnWorker cannot pass its connection settings'):
        worker.bootstrap()
    assert conn.scard('rq:workers') == 0  # refused before anything was written


@pytest.mark.parametrize(
    ('url', 'connection_class', 'expected'),
    [
        (
            'rediss://127.0.0.1:6380/5?ssl_cert_reqs=none',
            redis.SSLConnection,
            {'port': 6380, 'db': 5, 'ssl_cert_reqs': 'none'},
        ),
        (
            'unix:///tmp/rq-epoch.sock?db=5&password=secret',
            redis.UnixDomainSocketConnection,
            {'path': '/tmp/rq-epoch.sock', 'db': 5, 'password': 'secret'},
        ),
    ],
)
def test_the_work_horse_connection_is_rebuilt_with_the_workers_class_and_settings(
    url: str, connection_class: type, expected: dict
) -> None:
    """What the spawned work-horse is given survives pickling, and rebuilds TLS and Unix-socket
    connections as the worker made them (no connection is opened here)."""
    original = redis.Redis.from_url(url)
    rebuilt = rebuild_connection(pickle.loads(pickle.dumps(connection_spec(original))))
    assert rebuilt.connection_pool.connection_class is connection_class
    kwargs = rebuilt.connection_pool.connection_kwargs
    assert {name: kwargs.get(name) for name in expected} == expected


def test_a_spawned_work_horse_runs_the_job_when_the_execution_record_expired_while_the_worker_froze(
    server, proxy, start_worker, tmp_path: Path
) -> None:
    """The worker freezes past the lease while its work-horse starts; the execution's record
    expires meanwhile, nothing sweeps, and the worker thaws still holding the lease. The
    work-horse runs the job: it is given the execution, it does not read the expired record."""
    log = tmp_path / 'log'
    conn = server.client()
    worker, job = _held_at_the_first_read(start_worker, proxy, conn, 'spawn-frozen', log)
    execution_key = f'rq:execution:{job.id}:{conn.hget(job.key, "lease_execution").decode()}'
    os.kill(worker.pid, signal.SIGSTOP)  # a frozen machine: no heartbeat renews the record
    try:
        wait_for(lambda: not conn.exists(execution_key), 30, what='the execution record expired')
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    proxy.release()
    _ran_once_unharmed(conn, job, log, worker)
