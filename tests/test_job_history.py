"""``rq-epoch status --job``: one job's stall history, read by the same rule as ``rq_epoch.Job``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import redis
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.jobs.job import StartedJobRegistry
from rq_epoch.protocol import keys, scripts
from tests.conftest import ROOT, wait_for
from tests.leases import CURRENT, OTHER_EPOCH, current_run_id, expire, start_job
from tests.test_cli import run


def take_again(conn: redis.Redis, queue: Queue, job: Job, epoch: object = CURRENT) -> None:
    """Take a requeued job off its queue and grant it a lease that has expired, as a worker that died would."""
    conn.lrem(queue.key, 0, job.id)
    execution_id = uuid.uuid4().hex
    registry = StartedJobRegistry(queue.name, connection=conn)
    conn.zadd(registry.key, {f'{job.id}:{execution_id}': '+inf'})
    conn.hset(job.key, mapping={'status': 'started', 'worker_name': 'test-worker'})
    scripts.grant()(conn, [registry.leases_key, job.key], [job.id, 60, execution_id])
    if epoch is not CURRENT:
        conn.hset(job.key, 'lease_epoch', str(epoch))
    expire(conn, queue.name, job.id)


def history(server: EmbeddedServer, job_id: str) -> dict[str, Any]:
    result = run('status', '-u', server.url, '--job', job_id, '--json')
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [job['job_id'] for job in doc['jobs']] == [job_id]
    return doc['jobs'][0]


def test_history_of_a_job_that_stalled_crossed_a_restart_died_and_was_requeued(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    queue = Queue('hist', connection=conn)
    run_id = current_run_id(conn)
    sweeper = Sweeper(conn, restart_grace=0)
    job, _ = start_job(conn, queue, epoch=CURRENT, max_stalled=2)
    assert [v.verdict for v in sweeper.sweep(['hist']).verdicts] == ['recovered']
    take_again(conn, queue, job, epoch=OTHER_EPOCH)
    assert [v.verdict for v in sweeper.sweep(['hist']).verdicts] == ['exempt']

    one = history(server, job.id)
    assert (one['status'], one['stalled'], one['max_stalled'], one['max_stalled_source']) == ('queued', 1, 2, 'job')
    assert (one['exempt_recoveries'], one['stall_epochs']) == (1, [run_id])
    assert (one['dead_letter'], one['requeued_since_dead_letter'], one['dead_letter_results']) == (False, False, [])
    assert one['lease'] is None and one['lease_epoch'] == OTHER_EPOCH and one['lease_epoch_is_current'] is False

    take_again(conn, queue, job)
    live = history(server, job.id)
    assert live['lease']['expired'] is True and live['lease_epoch_is_current'] is True
    assert [v.verdict for v in sweeper.sweep(['hist']).verdicts] == ['dead']

    dead = history(server, job.id)
    assert (dead['status'], dead['stalled'], dead['stall_epochs']) == ('failed', 2, [run_id, run_id])
    assert (dead['dead_letter'], dead['requeued_since_dead_letter']) == (True, False)
    assert len(dead['dead_letter_results']) == 1
    assert dead['dead_letter_results'][0]['reason'].startswith('StalledJobError: job stalled 2 time(s) (max_stalled 2)')
    text = run('status', '-u', server.url, '--job', job.id).stdout
    assert f'job {job.id} (queue hist): failed' in text
    assert "stalled            2/2 (budget: the job's own)" in text
    assert f'counted under      {run_id} x2 (the current server process)' in text
    assert 'exempt recoveries  1' in text
    assert 'dead letter        yes' in text and 'requeued since     no' in text

    # Requeued with stock RQ's own command: a fresh budget, the same for Job, status and status --job.
    requeue = subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'requeue', '--url', server.url, '--queue', 'hist', job.id],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert requeue.returncode == 0, requeue.stderr
    assert conn.hget(job.key, 'stalled') == b'2'  # the raw field, until the next grant resets it
    assert Job.fetch(job.id, connection=conn).stalled == 0
    again = history(server, job.id)
    assert (again['status'], again['stalled'], again['stall_epochs']) == ('queued', 0, [])
    assert (again['dead_letter'], again['requeued_since_dead_letter']) == (False, True)
    queues = json.loads(run('status', '-u', server.url, '-q', 'hist', '--json').stdout)['queues']
    assert queues['hist']['stalled_jobs'] == []
    assert queues['hist']['dead_letters'] == []
    assert 'jobs stalled > 0  0' in run('status', '-u', server.url, '-q', 'hist').stdout


def test_history_after_a_real_worker_ran_the_requeued_dead_letter(
    server: EmbeddedServer, conn: redis.Redis, start_worker
) -> None:
    queue = Queue('hist', connection=conn)
    job, _ = start_job(conn, queue, epoch=CURRENT, max_stalled=1)
    assert [v.verdict for v in Sweeper(conn, restart_grace=0).sweep(['hist']).verdicts] == ['dead']
    from rq.registry import FailedJobRegistry

    FailedJobRegistry('hist', connection=conn).requeue(job.id)
    start_worker('hist', burst=True)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 60, what='requeued dead letter finished')
    done = history(server, job.id)
    assert (done['status'], done['stalled'], done['max_stalled']) == ('finished', 0, 1)
    assert (done['dead_letter'], done['requeued_since_dead_letter']) == (False, True)
    assert len(done['dead_letter_results']) == 1
    assert conn.hget(job.key, 'stall_dead') is None  # the grant cleared the mark; the results remember
    assert conn.zcard(keys.leases_key('hist')) == 0
    assert done['lease'] is None


def test_unknown_job_is_exit_1_and_job_with_queues_is_bad_usage(server: EmbeddedServer, conn: redis.Redis) -> None:
    missing = run('status', '-u', server.url, '--job', 'nope')
    assert missing.exit_code == 1
    assert missing.stderr.strip().startswith("Error: no job 'nope'")
    assert run('status', '-u', server.url, '--job', 'x', '-q', 'hist').exit_code == 2
