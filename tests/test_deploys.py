"""A deploy costs a running job nothing: each supervisor's real stop sequence on a real worker.

Every test runs a job on a real ``rq worker`` (``--worker-class rq_epoch.Worker`` or a
flavour), stops the worker the way one kind of supervisor does (:mod:`tests.supervisors`, real
signals to the real processes), then starts another worker and lets the job finish there. Each
asserts that the job was never failed, that its counted stalls did not move, that it ran again
on the new worker, and that it ended with exactly one outcome (one finished result). As a
control, a worker SIGKILLed with no stop signal is still counted once.

Short settings make it quick: heartbeat 1 s, lease margin 2 s (a lease of 3 s), sweep
interval 1 s (the fixture's), and a shutdown timeout per test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Queue
from rq_epoch.compat import text
from rq_epoch.pids import send_signal
from rq_epoch.protocol import keys
from tests import supervisors
from tests.conftest import ROOT, WorkerProcess, wait_for

QUEUE = 'deploys'


class Run:
    """One job that runs until released, and what the tests read of it."""

    def __init__(self, conn: redis.Redis, tmp_path: Path) -> None:
        self.conn = conn
        self.log = tmp_path / 'runs.log'
        self.release = tmp_path / 'release'
        self.job = Queue(QUEUE, connection=conn).enqueue(
            'tests.jobs.wait_for_file_then_record', str(self.log), 'job', str(self.release), 120, job_timeout=300
        )

    def starts(self) -> int:
        """How many times the job function started."""
        if not self.log.exists():
            return 0
        return sum(1 for line in self.log.read_text().splitlines() if line.startswith('start '))

    def field(self, name: str) -> str:
        return text(self.conn.hget(keys.job_key(self.job.id), name))

    def counter(self, name: str) -> int:
        return int(text(self.conn.hget(keys.stats_key(QUEUE), name)) or 0)

    def wait_running(self, times: int, worker: WorkerProcess | None = None) -> None:
        """Wait until the job function has started ``times`` times (and, given a forking
        ``worker``, until it has a work-horse to stop)."""
        wait_for(lambda: self.starts() >= times, 60, what=f'start number {times} of the job')
        if worker is not None:
            wait_for(lambda: supervisors.process_tree(worker.pid)[1:], 30, what='the work-horse')

    def finish_on(self, worker: WorkerProcess) -> None:
        """Let the job run again on ``worker``, release it, and wait for its one outcome."""
        self.wait_running(2)
        self.release.write_text('go')
        wait_for(
            lambda: self.field('status') in (JobStatus.FINISHED.value, JobStatus.FAILED.value),
            60,
            what='the job to end',
        )
        assert worker.proc.poll() is None, worker.output()

    def assert_one_outcome_uncounted(self) -> None:
        """Never failed, no counted stall, ran twice, one finished result."""
        assert self.field('status') == JobStatus.FINISHED.value
        assert int(self.field('stalled') or 0) == 0
        assert self.job.id not in FailedJobRegistry(QUEUE, connection=self.conn).get_job_ids()
        assert self.starts() == 2
        results = self.job.results()
        assert len(results) == 1, results
        assert results[0].type.name == 'SUCCESSFUL'


def _env(shutdown_timeout: str) -> dict[str, str]:
    return {'RQ_EPOCH_SHUTDOWN_TIMEOUT': shutdown_timeout}


def _handed_back(run: Run, first: WorkerProcess) -> None:
    """The first worker handed the job back and exited 0."""
    assert first.proc.returncode == 0, first.output()
    assert 'handed job' in first.output(), first.output()
    assert run.field('handed_back') == '1'
    assert run.counter('handed_back') == 1


# -- Kubernetes, ECS, docker stop: SIGTERM to the worker, SIGKILL to all after the grace --------


def test_kubernetes_grace_shorter_than_the_timeout_is_requeued_uncounted_as_stopping(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('30'))
    run.wait_running(1, first)
    supervisors.term_worker_then_kill_all(first, grace=1.5)
    assert first.proc.returncode == -signal.SIGKILL
    assert 'marked the lease' in first.output(), first.output()
    second = start_worker(QUEUE, env=_env('30'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()
    assert run.counter('stopping') == 1
    assert run.field('stopping_recoveries') == '1'
    assert run.counter('recovered') == 0


def test_kubernetes_grace_longer_than_the_timeout_hands_the_job_back(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'))
    run.wait_running(1, first)
    supervisors.term_worker_then_kill_all(first, grace=15)
    _handed_back(run, first)
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()
    assert run.counter('stopping') == 0


# -- systemd's default (control-group), supervisor's stopasgroup: SIGTERM to every process ------


@pytest.mark.parametrize('worker_class', ['rq_epoch.Worker', 'rq_epoch.SpawnWorker'])
def test_systemd_control_group_term_to_every_process_hands_the_job_back(
    conn: redis.Redis, start_worker: Any, tmp_path: Path, worker_class: str
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'), worker_class=worker_class)
    run.wait_running(1, first)
    supervisors.term_all_then_kill_all(first, grace=15)
    _handed_back(run, first)
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


def test_systemd_control_group_grace_shorter_than_the_timeout_is_stopping(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('30'))
    run.wait_running(1, first)
    supervisors.term_all_then_kill_all(first, grace=1.5)
    assert first.proc.returncode == -signal.SIGKILL
    second = start_worker(QUEUE, env=_env('30'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()
    assert run.counter('stopping') == 1


# -- systemd KillMode=mixed, supervisor without stopasgroup: SIGTERM to the worker only ----------


def test_term_to_the_worker_only_hands_the_job_back(conn: redis.Redis, start_worker: Any, tmp_path: Path) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'))
    run.wait_running(1, first)
    supervisors.term_worker_then_kill_worker(first, grace=15)
    _handed_back(run, first)
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- a terminal: Ctrl-C twice -------------------------------------------------------------------


def test_ctrl_c_twice_hands_the_job_back_at_once(conn: redis.Redis, start_worker: Any, tmp_path: Path) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('120'), own_group=True)
    run.wait_running(1, first)
    supervisors.interrupt_group_twice(first, gap=1.5, exit_within=15)
    _handed_back(run, first)
    assert 'cold shut down' in first.output()
    second = start_worker(QUEUE, env=_env('120'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- RQ's shutdown command (warm) -------------------------------------------------------------


def test_rqs_shutdown_command_is_a_warm_stop_that_hands_the_job_back(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    from rq.command import send_shutdown_command
    from rq.worker import Worker as RQWorker

    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'))
    run.wait_running(1, first)
    (registered,) = wait_for(lambda: RQWorker.all(connection=conn), 30, what='the worker registered')
    send_shutdown_command(conn, registered.name)
    first.proc.wait(30)
    _handed_back(run, first)
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- the worker pool --------------------------------------------------------------------------


def test_the_worker_pool_stopped_with_sigterm_hands_the_job_back(
    conn: redis.Redis, start_worker: Any, tmp_path: Path, server: Any
) -> None:
    run = Run(conn, tmp_path)
    environ = {
        **os.environ,
        'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''),
        'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
        'RQ_EPOCH_LEASE_MARGIN': '2',
        'RQ_EPOCH_SWEEP_INTERVAL': '1',
        'RQ_EPOCH_SHUTDOWN_TIMEOUT': '2',
        'PYTHONUNBUFFERED': '1',
    }
    log = tmp_path / 'pool.log'
    argv = [sys.executable, '-m', 'rq.cli', 'worker-pool', '--url', server.url, '--worker-class', 'rq_epoch.Worker']
    with open(log, 'wb') as fh:
        pool = subprocess.Popen([*argv, '-n', '1', QUEUE], stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=environ)
    try:
        run.wait_running(1)
        wait_for(lambda: len(supervisors.process_tree(pool.pid)) >= 3, 30, what='the pool, its worker, its work-horse')
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(60) == 0, log.read_text()
    finally:
        if pool.poll() is None:
            for pid, started in supervisors.process_tree(pool.pid):
                send_signal(pid, signal.SIGKILL, started)
            pool.wait(10)
    assert 'handed job' in log.read_text(), log.read_text()
    assert run.counter('handed_back') == 1
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- Heroku: SIGTERM to every process, with RQ's HerokuWorker ---------------------------------


def test_heroku_term_to_every_process_hands_the_job_back(conn: redis.Redis, start_worker: Any, tmp_path: Path) -> None:
    run = Run(conn, tmp_path)
    # The shutdown timeout is longer than RQ's imminent-shutdown delay (6 s): the job's
    # ShutDownImminentException hands it back, in the work-horse.
    first = start_worker(QUEUE, env=_env('30'), worker_class='rq_epoch.HerokuWorker')
    run.wait_running(1, first)
    supervisors.term_all_then_kill_all(first, grace=25)
    _handed_back(run, first)
    assert 'ShutDownImminentException' in first.output() or 'Imminent shutdown' in first.output()
    second = start_worker(QUEUE, env=_env('30'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- SimpleWorker: the job runs in the worker process ----------------------------------------


def test_simple_worker_hands_the_job_back_and_ends_its_process(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'), worker_class='rq_epoch.SimpleWorker')
    run.wait_running(1)
    supervisors.term_all_then_kill_all(first, grace=15)
    _handed_back(run, first)
    second = start_worker(QUEUE, env=_env('2'))
    run.finish_on(second)
    run.assert_one_outcome_uncounted()


# -- the control: a worker killed with no stop signal is still counted --------------------------


def test_sigkill_with_no_stop_signal_is_still_counted_once(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('2'))
    run.wait_running(1, first)
    supervisors.kill_all(first)
    second = start_worker(QUEUE, env=_env('2'))
    run.wait_running(2)
    assert run.field('stalled') == '1'
    assert run.counter('recovered') == 1
    assert run.counter('stopping') == 0
    assert run.counter('handed_back') == 0
    run.release.write_text('go')
    wait_for(lambda: run.field('status') == JobStatus.FINISHED.value, 60, what='the job to end')
    assert len(run.job.results()) == 1
    assert second.proc.poll() is None


# -- the job ends during the warm wait: its outcome stands, nothing is handed back ------------


def test_a_job_that_ends_within_the_shutdown_timeout_keeps_its_outcome_and_is_not_handed_back(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('120'))
    run.wait_running(1, first)
    first.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: 'marked the lease' in first.output(), 30, what='the stop mark')
    run.release.write_text('go')
    assert first.proc.wait(30) == 0, first.output()
    assert run.field('status') == JobStatus.FINISHED.value
    assert run.starts() == 1
    assert len(run.job.results()) == 1
    assert run.field('handed_back') == ''
    assert run.counter('handed_back') == 0
    assert Queue(QUEUE, connection=conn).get_job_ids() == []


def test_an_unlimited_shutdown_timeout_waits_for_the_job_and_keeps_its_lease_meanwhile(
    conn: redis.Redis, start_worker: Any, tmp_path: Path
) -> None:
    """``RQ_EPOCH_SHUTDOWN_TIMEOUT=unlimited``: a warm stop waits for the job as RQ does; the
    worker keeps extending the lease for longer than a whole lease after the stop, and the job
    ends once, on this worker, not handed back."""
    run = Run(conn, tmp_path)
    first = start_worker(QUEUE, env=_env('unlimited'))
    run.wait_running(1, first)
    first.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: 'marked the lease' in first.output(), 30, what='the stop mark')
    assert 'waiting for it as long as it runs' in first.output(), first.output()
    leases = keys.leases_key(QUEUE)
    at_stop = conn.zscore(leases, run.job.id)
    assert at_stop is not None
    lease = 3.0  # seconds: heartbeat 1 s + lease margin 2 s (the fixture's)
    wait_for(
        lambda: (conn.zscore(leases, run.job.id) or 0) > at_stop + lease,
        30,
        what='the lease extended for more than a whole lease after the stop',
    )
    assert first.proc.poll() is None, first.output()
    assert run.field('handed_back') == ''
    run.release.write_text('go')
    assert first.proc.wait(30) == 0, first.output()
    assert run.field('status') == JobStatus.FINISHED.value
    assert run.starts() == 1
    assert len(run.job.results()) == 1
    assert int(run.field('stalled') or 0) == 0
    assert run.counter('handed_back') == 0
