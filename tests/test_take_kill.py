"""A worker on two or three queues, SIGKILLed right after its take, loses no job.

The dying worker (``tests.workers.EpochWorkerDiesAfterTake``) kills itself as soon as the
take script returned a job; a second worker with the same dequeue strategy then sweeps,
rescues the job from the intermediate list uncounted, and runs it once. Stock RQ's worker
killed right after its ``BLPOP`` returned (``tests.workers.StockQueueDiesAfterPop``) loses
the job: it is "queued" in no list anything runs from.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from rq.queue import Queue as StockQueue

from rq_epoch import Queue
from rq_epoch.protocol import keys
from tests.takes import FAST, STRATEGIES, names, ran_once_uncounted, stock_lost


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('strategy', STRATEGIES)
def test_worker_killed_right_after_the_take_loses_nothing(
    conn, start_worker, tmp_path: Path, strategy: str, n: int
) -> None:
    queue_names = names(n)
    log = tmp_path / 'log'
    job = Queue(queue_names[-1], connection=conn).enqueue('tests.jobs.record', str(log), 'start')
    dying = start_worker(
        *queue_names,
        worker_class='tests.workers.EpochWorkerDiesAfterTake',
        env=FAST,
        args=['--dequeue-strategy', strategy],
    )
    assert dying.proc.wait(30) == -signal.SIGKILL
    assert conn.lrange(keys.intermediate_key(queue_names[-1]), 0, -1) == [job.id.encode()]  # the trace
    assert conn.hget(job.key, 'status') == b'queued'
    worker = start_worker(*queue_names, env=FAST, args=['--dequeue-strategy', strategy])
    ran_once_uncounted(conn, queue_names, job, log)
    assert "sweep judged 1 expired lease(s): {'exempt': 1}" in worker.output()


@pytest.mark.parametrize('n', [2, 3])
def test_stock_rq_loses_the_job_when_killed_right_after_the_pop(conn, start_worker, tmp_path: Path, n: int) -> None:
    for strategy in STRATEGIES:
        queue_names = names(n, f'-{strategy}')
        log = tmp_path / f'log-{strategy}'
        job = StockQueue(queue_names[-1], connection=conn).enqueue('tests.jobs.record', str(log), 'start')
        dying = start_worker(
            *queue_names,
            worker_class=None,
            args=['--queue-class', 'tests.workers.StockQueueDiesAfterPop', '--dequeue-strategy', strategy],
        )
        assert dying.proc.wait(30) == -signal.SIGKILL
        stock_lost(conn, queue_names, job.id, log, start_worker)
