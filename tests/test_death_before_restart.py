"""A worker's death whose lease ran out before a restart is counted once, after the restart.

The lease is stamped by the process that granted it; the scripts note each process alive as
primary (``<prefix>:epoch:alive``). When that record shows the old process serving after the
lease's deadline, the sweep of the new process counts the death at once (no restart grace);
when the restart came before the deadline, the lease stays exempt. Real servers (AOF with
``appendfsync always``), real ``rq worker`` processes killed with SIGKILL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol import epoch, keys
from tests.conftest import SERVER_KINDS, wait_for

#: The workers here never sweep on their own: only the test's sweeps judge.
NO_SWEEP = {'RQ_EPOCH_SWEEP_INTERVAL': '3600'}
#: A grace no test waits for: a verdict other than "deferred" was not held back by it.
LONG_GRACE = 3600


@pytest.fixture(scope='module', params=SERVER_KINDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """This module's server: every write is on disk before it is acknowledged, so kill -9 loses none."""
    data_dir = tmp_path_factory.mktemp(f'{request.param}-always')
    srv = EmbeddedServer(request.param, data_dir=data_dir, appendfsync='always')
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def executions(log: Path, tag: str) -> int:
    return (log.read_text() if log.exists() else '').count(f'start {tag} ')


def server_time(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def deadline_of(conn: redis.Redis, queue: str, job_id: str) -> float | None:
    score = conn.zscore(keys.leases_key(queue), job_id)
    return None if score is None else float(score)


def seen_alive(conn: redis.Redis, run_id: str) -> epoch.SeenAlive | None:
    return epoch.parse_seen_alive(conn.hget(keys.alive_key(), run_id))


def seen_after(conn: redis.Redis, run_id: str, deadline: float) -> bool:
    """Whether the process's record shows it alive after the deadline (the sweep's proof)."""
    return epoch.died_under(deadline, seen_alive(conn, run_id))


def verdicts_of(report, job_id: str) -> list[tuple[str, int]]:  # noqa: ANN001 - a SweepReport
    return [(v.verdict, v.stalled) for v in report.verdicts if v.job_id == job_id]


def keeper(queue: Queue, start_worker, tmp_path: Path) -> None:  # noqa: ANN001 - the fixture
    """A second worker busy with a long job: its heartbeats note the server alive every second."""
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(tmp_path / 'keeper-log'), 'k',
                        str(tmp_path / 'keeper-release'))  # fmt: skip
    start_worker(queue.name, env=NO_SWEEP)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='the keeper job running')


def running_victim(conn: redis.Redis, queue: Queue, start_worker, log: Path, tag: str, **enqueue: object):  # noqa: ANN001, ANN201
    """A job running on its own worker (sweeps off), once its function has started."""
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), tag, str(log) + '.release', **enqueue)
    worker = start_worker(queue.name, env=NO_SWEEP)
    wait_for(lambda: executions(log, tag) == 1, 30, what='the job function running')
    return job, worker


@pytest.mark.parametrize('restart', ['shutdown', 'kill -9'])
def test_lease_expired_before_the_restart_is_counted_at_once(conn, server, start_worker, tmp_path, restart) -> None:
    queue = Queue('died', connection=conn)
    log = tmp_path / 'log'
    job, victim = running_victim(conn, queue, start_worker, log, 'v', max_stalled=3)
    keeper(queue, start_worker, tmp_path)
    old = server.run_id()
    victim.kill()
    deadline = wait_for(lambda: deadline_of(conn, 'died', job.id), 5, what='the lease')
    # No sweep runs; the keeper's heartbeats note the server alive past the deadline.
    wait_for(lambda: seen_after(conn, old, deadline), 20, what='the server noted alive after the deadline')
    server.restart(crash=restart == 'kill -9')
    conn = server.client()
    assert server.run_id() != old
    assert conn.hget(job.key, 'lease_epoch') == old.encode()
    report = Sweeper(conn, max_stalled=3, restart_grace=LONG_GRACE).sweep(['died'])
    assert report.uptime < LONG_GRACE  # a fresh process: the grace was not over
    assert verdicts_of(report, job.id) == [('recovered', 1)]
    job = Job.fetch(job.id, connection=conn)
    assert (job.stalled, job.exempt_recoveries) == (1, 0)
    assert job.get_status() == JobStatus.QUEUED
    assert conn.hget(job.key, 'stall_epochs') == old.encode()
    assert int(conn.hget(keys.stats_key('died'), 'recovered') or 0) == 1


def test_restart_before_the_lease_expired_leaves_the_death_exempt(conn, server, start_worker, tmp_path) -> None:
    queue = Queue('cut', connection=conn)
    log = tmp_path / 'log'
    job, victim = running_victim(conn, queue, start_worker, log, 'c', max_stalled=1)
    keeper(queue, start_worker, tmp_path)
    old = server.run_id()
    # Kill right after a heartbeat moved the deadline, and stop the server at once: it goes
    # down a whole lease (3 s) before the deadline.
    before = deadline_of(conn, 'cut', job.id)
    wait_for(lambda: deadline_of(conn, 'cut', job.id) != before, 5, what='a heartbeat')
    victim.kill()
    deadline = deadline_of(conn, 'cut', job.id)
    assert deadline is not None
    server.stop()
    server.start()
    conn = server.client()
    assert not seen_after(conn, old, deadline)  # the old process was not seen alive after it
    wait_for(lambda: server_time(conn) > deadline, 10, what='the deadline passed')
    assert verdicts_of(Sweeper(conn, restart_grace=LONG_GRACE).sweep(['cut']), job.id) == [('deferred', 0)]
    report = Sweeper(conn, restart_grace=0).sweep(['cut'])
    assert verdicts_of(report, job.id) == [('exempt', 0)]
    job = Job.fetch(job.id, connection=conn)
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    assert job.id not in FailedJobRegistry('cut', connection=conn)


def test_a_live_worker_rides_through_a_restart_longer_than_its_lease(conn, server, start_worker, tmp_path) -> None:
    """The record never proves a live worker dead: its lease outlives every note of its server."""
    queue = Queue('live', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    # The job runs until the test has read its lease after the restart: a job that ended while
    # the test was still reconnecting would leave no lease to read.
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'r', str(release), max_stalled=1)
    # Sweeping every second; a lease of 5 s and a grace of 15 s, so that a loaded machine's late
    # heartbeat or slow reconnection is not what the test measures.
    env = {'RQ_EPOCH_LEASE_MARGIN': '4', 'RQ_EPOCH_RESTART_GRACE': '15'}
    worker = start_worker('live', env=env)
    wait_for(lambda: executions(log, 'r') == 1, 30, what='the job function running')
    idle = start_worker('live', env=env)  # sweeping every second too
    wait_for(lambda: 'ubscribing to channel' in idle.output(), 30, what='the idle worker up')
    old = server.run_id()
    server.restart(down_for=6, crash=True)  # longer than the lease
    conn = server.client()
    deadline = deadline_of(conn, 'live', job.id)
    assert deadline is not None and not seen_after(conn, old, deadline), worker.output()
    release.touch()
    wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 40, what='the job finished')
    job = Job.fetch(job.id, connection=conn)
    assert executions(log, 'r') == 1
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert worker.proc.poll() is None, worker.output()
    assert job.worker_name and job.worker_name in worker.output()
    stats = conn.hgetall(keys.stats_key('live'))
    assert b'recovered' not in stats and b'dead' not in stats and b'exempt' not in stats


def test_a_pill_with_a_restart_after_each_death_dies_after_max_stalled_runs(
    conn, server, start_worker, tmp_path
) -> None:
    queue = Queue('pill', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.poison_pill', str(log), 'p', max_stalled=2)
    keeper(Queue('keep', connection=conn), start_worker, tmp_path)
    verdicts: list[tuple[str, int]] = []
    for run in (1, 2):
        conn = server.client()
        old = server.run_id()
        victim = start_worker('pill', env=NO_SWEEP)
        wait_for(lambda: executions(log, 'p') == run, 30, what=f'run {run} of the pill')  # noqa: B023
        wait_for(lambda: victim.proc.poll() is not None, 10, what='the pill killed its worker')  # noqa: B023
        deadline = wait_for(lambda: deadline_of(conn, 'pill', job.id), 5, what='the lease')  # noqa: B023
        wait_for(lambda: seen_after(conn, old, deadline), 20, what='noted alive after the deadline')  # noqa: B023
        server.restart(crash=run == 2)
        conn = server.client()
        verdicts += verdicts_of(Sweeper(conn, restart_grace=LONG_GRACE).sweep(['pill']), job.id)
    assert verdicts == [('recovered', 1), ('dead', 2)]
    assert executions(log, 'p') == 2
    conn = server.client()
    wait_for(lambda: conn.hget(job.key, 'status') == b'failed', 10, what='dead-lettered')
    assert job.id in FailedJobRegistry('pill', connection=conn)
    assert Job.fetch(job.id, connection=conn).stalled == 2
