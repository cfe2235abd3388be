"""A real Prometheus scrapes ``rq-epoch exporter`` beside real workers and fires the shipped alerts.

Prometheus (Debian's package) scrapes and evaluates every second, with the shipped rules in
which every duration is divided by :data:`FACTOR` (``for: 5m`` becomes ``3s``, ``[15m]`` becomes
``[9s]``, a 300 s sweep age 3 s): the expressions are the shipped ones. Workers use a 1 s
heartbeat, a 4 s lease margin, a sweep every second and a 4 s restart grace.

The story, on one server: two workers SIGKILLed while running jobs (two counted stalls); a
poison pill that takes two workers down (a counted stall, then a dead letter): the dead-letter
and the counted-stalls alerts fire; the last worker of the queue stopped: the sweeps-stopped
alert fires; then a server restart, long enough for the exporter alert, with a worker killed
while the server is down (its lease crosses the restart; a live worker's sweep requeues it
uncounted) and one whose queue nobody sweeps (its lease waits past the grace): a new epoch, an
uncounted recovery, and no stall alert for it.

Each alert's time from its event to "firing" (seen by polling the API every 0.2 s) is printed
at the end: ``pytest -s tests/test_prometheus_alerts.py``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import JobStatus

from rq_epoch import Job, Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for
from tests.prometheus import PrometheusServer, compress_rules
from tests.test_metrics import ExporterProcess
from tests.tools import system_tool

pytestmark = [pytest.mark.parametrize('server', ['valkey'], indirect=True), pytest.mark.slow]

SHIPPED_RULES = ROOT / 'examples' / 'prometheus' / 'rq-epoch-alerts.yml'
#: Durations of the shipped rules are divided by this.
FACTOR = 100
#: The workers' restart grace, and the exporter's.
GRACE = 4
#: A 5 s lease (1 s heartbeat, 4 s margin): a busy machine does not make a live one expire.
WORKER_ENV = {'RQ_EPOCH_LEASE_MARGIN': '4', 'RQ_EPOCH_RESTART_GRACE': str(GRACE)}
STALL_ALERTS = ('RqEpochCountedStallsRising', 'RqEpochDeadLettersRising')


def working(workers: list[Any]) -> list[Any]:
    """The workers alive and running a job (they have a work-horse)."""
    return [w for w in workers if w.proc.poll() is None and w.horse_pids()]


def status(job: Job) -> Any:
    return job.get_status(refresh=True)


def test_prometheus_fires_the_shipped_alerts_for_real_events(
    server: EmbeddedServer, conn: redis.Redis, start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    binary = system_tool('prometheus')
    rules = compress_rules(SHIPPED_RULES, tmp_path / 'rules.yml', FACTOR)
    assert rules['RqEpochSweepsStopped']['for'] == '3s'
    measured: dict[str, float] = {}
    log, release = str(tmp_path / 'log'), str(tmp_path / 'release')
    work = Queue('work', connection=conn)
    start = functools.partial(start_worker, env=WORKER_ENV)
    workers = [start('work') for _ in range(5)]
    exporter = ExporterProcess(['--url', server.url, '--grace', str(GRACE)])
    target = exporter.url.split('/')[2]
    prometheus = PrometheusServer(binary, tmp_path, [target], [tmp_path / 'rules.yml']).start()
    try:
        wait_for(lambda: prometheus.value('rq_epoch_up') == 1, 30, interval=0.2, what='the first scrape')

        # Two workers SIGKILLed while running jobs: counted stalls, seen through Prometheus.
        held = [work.enqueue('tests.jobs.wait_for_file_then_record', log, t, release, max_stalled=3) for t in 'ab']
        # The lease is granted before the fork, the job marked started in the work-horse: a worker
        # killed in between leaves a job that never ran, which the sweep requeues uncounted.
        wait_for(
            lambda: all(status(job) == JobStatus.STARTED for job in held) and len(working(workers)) == 2,
            60,
            what='two workers running the jobs under a lease',
        )
        killed_at = time.time()
        for worker in working(workers):
            worker.kill()
        stalls = 'sum(rq_epoch_sweep_verdicts_total{queue="work", verdict="recovered"})'
        wait_for(lambda: prometheus.value(stalls) == 2, 30, interval=0.2, what='two counted stalls in Prometheus')
        measured['counted stall in rq_epoch_sweep_verdicts_total (query)'] = time.time() - killed_at
        wait_for(lambda: prometheus.value('rq_epoch_stalled_jobs{queue="work"}') == 2, 30, interval=0.2)
        assert all(Job.fetch(job.id, connection=conn).stalled == 1 for job in held)

        # A poison pill with a budget of 2 takes two workers down: a counted stall, then a dead letter.
        Path(release).touch()
        wait_for(lambda: all(status(job) == JobStatus.FINISHED for job in held), 60, what='the held jobs finishing')
        pill = work.enqueue('tests.jobs.poison_pill', log, 'p', max_stalled=2)
        wait_for(
            lambda: status(pill) == JobStatus.FAILED and conn.zcard(keys.finishing_key()) == 0,
            60,
            what='the poison pill dead-lettered',
        )
        dead_at = time.time()
        assert Job.fetch(pill.id, connection=conn).stalled == 2
        measured['RqEpochDeadLettersRising'] = prometheus.wait_firing('RqEpochDeadLettersRising', dead_at, queue='work')
        measured['RqEpochCountedStallsRising (4th counted stall)'] = prometheus.wait_firing(
            'RqEpochCountedStallsRising', dead_at, queue='work'
        )

        # Every sweeper of the queue stopped (the last worker, SIGTERM).
        [last] = [w for w in workers if w.proc.poll() is None]
        stopped_at = time.time()
        last.stop()
        assert last.proc.returncode == 0, last.output()
        # Meanwhile, workers on two other queues for the restart, each running a job.
        cross, orphan = Queue('cross', connection=conn), Queue('orphan', connection=conn)
        cross_workers = [start('cross'), start('cross')]
        orphan_worker = start('orphan')
        crossing = cross.enqueue('tests.jobs.wait_for_file_then_record', log, 'c', release + '2', max_stalled=1)
        orphaned = orphan.enqueue('tests.jobs.wait_for_file_then_record', log, 'o', release + '2', max_stalled=1)
        measured['RqEpochSweepsStopped'] = prometheus.wait_firing('RqEpochSweepsStopped', stopped_at, queue='work')

        wait_for(
            lambda: all(status(job) == JobStatus.STARTED for job in (crossing, orphaned)),
            60,
            what='the jobs of the restart running',
        )
        [cross_victim] = working(cross_workers)
        old_epoch = server.run_id()
        old_age = prometheus.value('rq_epoch_epoch_age_seconds')
        for name in ('cross', 'orphan'):  # their counters scraped before the restart
            series = f'rq_epoch_sweep_verdicts_total{{queue="{name}"}}'
            wait_for(lambda series=series: prometheus.query(series), 30, interval=0.2, what=series)
        verdicts = 'sum by (queue, verdict) (rq_epoch_sweep_verdicts_total{verdict=~"recovered|dead|exempt"})'
        before = {(m['queue'], m['verdict']): v for m, v in prometheus.query(verdicts)}

        # The restart: the server stays down until the exporter's alert fires; meanwhile the
        # worker of "cross" running a job and the worker of "orphan" are SIGKILLed.
        down_at = time.time()
        server.stop()
        cross_victim.kill()
        orphan_worker.kill()
        try:
            measured['RqEpochExporterCannotReadServer'] = prometheus.wait_firing(
                'RqEpochExporterCannotReadServer', down_at
            )
        finally:
            server.start()
        up_at = time.time()
        new_epoch = server.run_id()
        assert new_epoch != old_epoch
        conn = server.client()

        # A new epoch in Prometheus, and its age counted from the restart.
        wait_for(
            lambda: prometheus.query(f'rq_epoch_server_info{{run_id="{new_epoch}"}}'),
            30,
            interval=0.2,
            what='the new epoch in Prometheus',
        )
        assert not prometheus.query(f'rq_epoch_server_info{{run_id="{old_epoch}"}}')
        age = prometheus.value('rq_epoch_epoch_age_seconds')
        assert old_age is not None and age is not None and age < old_age

        # The lease that crossed the restart is requeued uncounted once the grace is over.
        exempt = 'sum(rq_epoch_sweep_verdicts_total{queue="cross", verdict="exempt"})'
        wait_for(lambda: prometheus.value(exempt) == 1, 30, interval=0.2, what='the uncounted recovery in Prometheus')
        seen_at = time.time()
        crossing_job = Job.fetch(crossing.id, connection=conn)
        assert (crossing_job.stalled, crossing_job.exempt_recoveries) == (0, 1)

        # The lease of the queue nobody sweeps waits past the grace.
        measured['RqEpochLeasesDeferredPastGrace (from the restart)'] = prometheus.wait_firing(
            'RqEpochLeasesDeferredPastGrace', up_at, queue='orphan'
        )
        # No stall alert for the restart: two evaluations after the uncounted recovery was
        # scraped, no stall counter moved and no stall alert is pending or firing for it.
        wait_for(lambda: prometheus.last_evaluation() > seen_at + 2, 30, interval=0.2, what='two more evaluations')
        after = {(m['queue'], m['verdict']): v for m, v in prometheus.query(verdicts)}
        assert after == before | {('cross', 'exempt'): 1.0}, (before, after)
        for name in STALL_ALERTS:
            for state in ('pending', 'firing'):
                for queue in ('cross', 'orphan'):
                    assert not prometheus.alerts(name, state, queue=queue), (name, state, queue)
    finally:
        Path(release).touch()
        Path(release + '2').touch()
        prometheus.stop()
        exporter.stop()
    print(f'\nseconds from the event to "firing" (rules compressed {FACTOR}x, scrape and evaluation every 1 s):')
    for name, seconds in measured.items():
        print(f'  {name:<55} {seconds:5.1f}')
