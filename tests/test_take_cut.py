"""A connection cut right after the take loses no job.

A loopback proxy forwards the worker's take to the server, then closes the connection
instead of forwarding the reply: the server has moved the job, the worker never learns
which. The worker rides out the cut, its sweep rescues the job from the intermediate list
uncounted, and it runs once. Stock RQ, the same cut after its ``BLPOP``: the job is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rq.queue import Queue as StockQueue

from rq_epoch import Queue
from rq_epoch.protocol import scripts
from tests.takes import FAST, STRATEGIES, names, ran_once_uncounted, stock_lost


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('strategy', STRATEGIES)
def test_connection_cut_right_after_the_take_loses_nothing(
    conn, proxy, start_worker, tmp_path: Path, strategy: str, n: int
) -> None:
    queue_names = names(n)
    log = tmp_path / 'log'
    job = Queue(queue_names[-1], connection=conn).enqueue('tests.jobs.record', str(log), 'start')
    proxy.cut(scripts.take().sha.encode())
    worker = start_worker(*queue_names, env=FAST, url=proxy.url, args=['--dequeue-strategy', strategy])
    assert proxy.cut_done.wait(30), 'the worker never took the job'
    ran_once_uncounted(conn, queue_names, job, log)
    assert worker.proc.poll() is None  # it rode out the cut


@pytest.mark.parametrize('n', [2, 3])
def test_stock_rq_loses_the_job_when_the_connection_is_cut_after_the_pop(
    conn, proxy, start_worker, tmp_path: Path, n: int
) -> None:
    for strategy in STRATEGIES:
        queue_names = names(n, f'-{strategy}')
        log = tmp_path / f'log-{strategy}'
        job = StockQueue(queue_names[-1], connection=conn).enqueue('tests.jobs.record', str(log), 'start')
        proxy.cut(b'BLPOP')
        cut = start_worker(*queue_names, worker_class=None, url=proxy.url, args=['--dequeue-strategy', strategy])
        assert proxy.cut_done.wait(30), 'the stock worker never popped the job'
        stock_lost(conn, queue_names, job.id, log, start_worker)
        assert cut.proc.poll() is None
        cut.stop()
