"""Bad configuration is a clear error at start, and nothing is written."""

from __future__ import annotations

import pytest
import redis

from rq_epoch import ConfigurationError, EpochSettings, EpochUnavailableError, Queue, Sweeper, Worker
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.leases import start_job


@pytest.mark.parametrize(
    'variable, value',
    [
        ('RQ_EPOCH_MAX_STALLED', '0'),
        ('RQ_EPOCH_MAX_STALLED', 'three'),
        ('RQ_EPOCH_HEARTBEAT_INTERVAL', '-1'),
        ('RQ_EPOCH_LEASE_MARGIN', '1.5'),
        ('RQ_EPOCH_SWEEP_INTERVAL', '0'),
        ('RQ_EPOCH_RESTART_GRACE', '-3'),
    ],
)
def test_bad_environment_values_are_rejected_with_the_variable_named(variable: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        EpochSettings.resolve(environ={variable: value})


def test_short_values_are_accepted() -> None:
    settings = EpochSettings.resolve(
        environ={'RQ_EPOCH_HEARTBEAT_INTERVAL': '1', 'RQ_EPOCH_LEASE_MARGIN': '2', 'RQ_EPOCH_SWEEP_INTERVAL': '1'}
    )
    assert (settings.heartbeat_interval, settings.lease_margin, settings.lease_ttl, settings.grace) == (1, 2, 3, 3)


def test_arguments_override_the_environment() -> None:
    settings = EpochSettings.resolve(environ={'RQ_EPOCH_MAX_STALLED': '7'}, max_stalled=2)
    assert settings.max_stalled == 2


def test_worker_rejects_a_class_that_is_not_a_job_class(conn) -> None:
    class Mine:
        pass

    with pytest.raises(ConfigurationError, match='must derive from rq.job.Job'):
        Worker(['default'], connection=conn, job_class=Mine)


def test_worker_uses_epoch_job_when_given_rq_default(conn) -> None:
    from rq.job import Job as StockJob

    from rq_epoch import Job

    worker = Worker(['default'], connection=conn, job_class=StockJob)
    assert worker.job_class is Job
    assert all(q.job_class is Job for q in worker.queues)


def test_bad_setting_stops_the_worker_at_start(conn, start_worker) -> None:
    worker = start_worker('default', env={'RQ_EPOCH_MAX_STALLED': 'lots'})
    wait_for(lambda: worker.proc.poll() is not None, 30, what='worker exit')
    assert worker.proc.returncode != 0
    assert 'RQ_EPOCH_MAX_STALLED must be a whole number' in worker.output()
    assert conn.keys('rq:worker:*') == []


@pytest.fixture
def no_info_user(server, conn):
    conn.acl_setuser(
        'noinfo', enabled=True, passwords=['+secret'], keys=['*'], channels=['*'], commands=['+@all', '-info']
    )
    client = redis.Redis(host='127.0.0.1', port=server.port, username='noinfo', password='secret')
    try:
        yield client
    finally:
        client.close()
        conn.acl_deluser('noinfo')


def test_sweep_without_info_permission_is_a_clear_error_and_writes_nothing(conn, no_info_user) -> None:
    queue = Queue('acl', connection=conn)
    start_job(conn, queue)
    before = {k: conn.type(k) for k in conn.keys('*')}
    leases = conn.zrange(keys.leases_key('acl'), 0, -1, withscores=True)
    with pytest.raises(EpochUnavailableError, match=r'\+info'):
        Sweeper(no_info_user, restart_grace=0).sweep(['acl'])
    assert {k: conn.type(k) for k in conn.keys('*')} == before
    assert conn.zrange(keys.leases_key('acl'), 0, -1, withscores=True) == leases


def test_scripts_without_info_permission_refuse_to_write(conn, no_info_user) -> None:
    from rq_epoch.protocol import scripts

    queue = Queue('acl', connection=conn)
    job = queue.enqueue('tests.jobs.add', 1, 2)
    with pytest.raises(EpochUnavailableError):
        scripts.grant()(no_info_user, [keys.leases_key('acl'), job.key], [job.id, 30, 'x'])
    assert conn.zcard(keys.leases_key('acl')) == 0
    assert conn.hget(job.key, 'lease_epoch') is None


def test_worker_without_info_permission_fails_at_start_naming_the_permission(conn, server, start_worker) -> None:
    conn.acl_setuser(
        'noinfo2', enabled=True, passwords=['+secret'], keys=['*'], channels=['*'], commands=['+@all', '-info']
    )
    url = f'redis://noinfo2:secret@127.0.0.1:{server.port}/0'
    worker = start_worker('default', args=['--url', url])
    wait_for(lambda: worker.proc.poll() is not None, 30, what='worker exit')
    assert worker.proc.returncode != 0
    assert '+info' in worker.output()
    assert conn.keys('rq:worker:*') == []
    assert conn.keys('rq:epoch:*') == []


def test_rq_monitoring_interval_is_the_heartbeat_unless_rq_epoch_sets_one(conn, monkeypatch) -> None:
    monkeypatch.delenv('RQ_EPOCH_HEARTBEAT_INTERVAL', raising=False)
    worker = Worker(['default'], connection=conn, job_monitoring_interval=7)
    assert (worker.job_monitoring_interval, worker.epoch_settings.heartbeat_interval) == (7, 7)
    # RQ's default (what `rq worker` passes when the option is not given): rq-epoch's default.
    worker = Worker(['default'], connection=conn, job_monitoring_interval=30)
    assert (worker.job_monitoring_interval, worker.epoch_settings.heartbeat_interval) == (10, 10)
    worker = Worker(['default'], connection=conn)
    assert (worker.job_monitoring_interval, worker.epoch_settings.heartbeat_interval) == (10, 10)
    monkeypatch.setenv('RQ_EPOCH_HEARTBEAT_INTERVAL', '2')
    worker = Worker(['default'], connection=conn, job_monitoring_interval=7)
    assert (worker.job_monitoring_interval, worker.epoch_settings.heartbeat_interval) == (2, 2)
