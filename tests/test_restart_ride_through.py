"""A server restart costs a job nothing: the worker rides it out (issue: ride-through)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import redis
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.pids import is_alive, send_signal
from rq_epoch.protocol import keys
from tests.conftest import wait_for


def executions(log: Path, tag: str) -> tuple[int, int]:
    text = log.read_text() if log.exists() else ''
    return text.count(f'start {tag} '), text.count(f'end {tag} ')


def fresh(server) -> redis.Redis:
    return server.client()


def test_restart_mid_job_same_worker_finishes_once_uncounted(conn, server, start_worker, tmp_path: Path) -> None:
    queue = Queue('ride', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'j', 10)
    worker = start_worker('ride')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    old = server.run_id()
    down_at = time.monotonic()
    server.restart(down_for=3)
    outage = time.monotonic() - down_at
    conn = fresh(server)
    new = server.run_id()
    assert new != old
    wait_for(
        lambda: conn.hget(job.key, 'lease_epoch') == new.encode() and conn.hget(job.key, 'status') == b'started',
        15,
        what='lease re-stamped by the new server process while the job runs',
    )
    wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 30, what='job finished')
    job = Job.fetch(job.id, connection=conn)
    assert worker.proc.poll() is None  # the same worker process, still serving
    assert executions(log, 'j') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert job.worker_name and job.worker_name in worker.output()
    assert len(job.results()) == 1
    assert 'server back after' in worker.output() and old in worker.output() and new in worker.output()
    latency = (job.ended_at - job.started_at).total_seconds() - 10
    print(f'outage {outage:.1f}s, extra job latency {latency:.2f}s')


def test_outage_longer_than_the_lease_is_reclaimed_within_the_grace(conn, server, start_worker, tmp_path) -> None:
    queue = Queue('long', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'L', 12)
    start_worker('long')  # lease = 1 s heartbeat + 2 s margin; grace 4 s
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    stop = threading.Event()
    verdicts: list[str] = []

    def sweep_continuously() -> None:
        client = server.client(socket_connect_timeout=0.5, socket_timeout=2)
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                report = Sweeper(client, restart_grace=4).sweep(['long'])
                verdicts.extend(v.verdict for v in report.verdicts)
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            time.sleep(0.05)

    sweeper = threading.Thread(target=sweep_continuously)
    sweeper.start()
    try:
        server.restart(down_for=5)  # longer than the 3 s lease: its deadline is past on return
        conn = fresh(server)
        new = server.run_id()
        wait_for(lambda: conn.hget(job.key, 'lease_epoch') == new.encode(), 4, what='lease reclaimed in grace')
        wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 30, what='job finished')
    finally:
        stop.set()
        sweeper.join(10)
    job = Job.fetch(job.id, connection=conn)
    assert executions(log, 'L') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert set(verdicts) <= {'deferred', 'settled'}
    assert 'exempt' not in verdicts and 'recovered' not in verdicts


def _end_during_outage(conn, server, start_worker, tmp_path: Path, func: str) -> Job:
    queue = Queue('outcome', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue(func, str(log), 'o', str(release))
    worker = start_worker('outcome')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    # The job's status says started before its work-horse calls the function: wait for the
    # function itself, so that it is the function, not the start, that meets the outage.
    wait_for(lambda: executions(log, 'o')[0] == 1, 30, what='job function running')
    server.stop()
    release.touch()
    wait_for(lambda: executions(log, 'o')[1] == 1, 10, what='job function ended during the outage')
    time.sleep(1)  # the outcome is due while the server is down
    server.start()
    conn = fresh(server)
    wait_for(lambda: conn.hget(job.key, 'status') in (b'finished', b'failed'), 30, what='outcome recorded')
    assert worker.proc.poll() is None
    return Job.fetch(job.id, connection=conn)


def test_success_during_outage_is_recorded_once_after_return(conn, server, start_worker, tmp_path) -> None:
    job = _end_during_outage(conn, server, start_worker, tmp_path, 'tests.jobs.wait_for_file_then_record')
    conn = fresh(server)
    assert job.get_status() == JobStatus.FINISHED
    assert job.id in FinishedJobRegistry('outcome', connection=conn)
    assert job.id not in FailedJobRegistry('outcome', connection=conn)
    assert len(job.results()) == 1
    assert conn.zcard(keys.leases_key('outcome')) == 0


def test_failure_during_outage_is_recorded_once_after_return(conn, server, start_worker, tmp_path) -> None:
    job = _end_during_outage(conn, server, start_worker, tmp_path, 'tests.jobs.fail_after_file')
    conn = fresh(server)
    assert job.get_status() == JobStatus.FAILED
    assert job.id in FailedJobRegistry('outcome', connection=conn)
    assert job.id not in FinishedJobRegistry('outcome', connection=conn)
    results = job.results()
    assert len(results) == 1 and 'failed on purpose' in (results[0].exc_string or '')


def test_worker_killed_during_outage_is_exempt_after_the_grace(conn, server, start_worker, tmp_path) -> None:
    queue = Queue('gone', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'g', str(release), max_stalled=1)
    worker = start_worker('gone')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    # Started is written before the work-horse calls the function: wait for the function, so
    # that the run the kill ends is one that ran it (the count below says it ran twice).
    wait_for(lambda: executions(log, 'g')[0] == 1, 30, what='job function running')
    server.stop()
    worker.kill()
    server.start()
    conn = fresh(server)
    sweeper = Sweeper(conn, restart_grace=4)
    assert {v.verdict for v in sweeper.sweep(['gone']).verdicts} <= {'deferred'}
    report = wait_for(lambda: (r := sweeper.sweep(['gone'])).total and r, 20, what='a sweep after the restart grace')
    assert report.uptime >= 4  # not before the grace: the server process had been up for 4 s
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(job.id, 'exempt', 0)]
    assert Job.fetch(job.id, connection=conn).stalled == 0
    release.touch()
    start_worker('gone', burst=True)
    wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 30, what='finished by another worker')
    assert executions(log, 'g') == (2, 1)


def test_stock_worker_does_not_survive_the_same_restart(conn, server, start_worker, tmp_path: Path) -> None:
    """For the record: stock RQ under the first scenario.

    The job runs until the test releases it, so its work-horse cannot end by itself; whether
    the horse lives is read in the same poll that sees the stock worker gone, before anything
    else happens (the horse's own fate after that, once the server is back, is not asserted).
    """
    from rq.queue import Queue as StockQueue

    queue = StockQueue('stock', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 's', str(release), 120, job_timeout=180)
    worker = start_worker('stock', worker_class=None)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    horses = wait_for(worker.horse_pids, 10, what='work-horse')
    alive_when_worker_quit: list[int] = []

    def worker_quit() -> bool:
        if worker.proc.poll() is None:
            return False
        alive_when_worker_quit.extend(pid for pid in horses if is_alive(pid))
        return True

    server.stop()
    try:
        wait_for(worker_quit, 15, what='stock worker giving up during the outage')
    finally:
        release.touch()
        server.start()
        for pid in horses:  # ours to end
            if is_alive(pid):
                send_signal(pid, signal.SIGKILL)
    assert 'quitting' in worker.output()
    assert alive_when_worker_quit == horses  # its work-horse was left running with nobody watching it
