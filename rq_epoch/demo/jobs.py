"""Job functions and the short-lease stock worker used by ``rq-epoch demo``.

They live in the package so that the demo's workers can import them wherever
``rq-epoch`` is installed; the demo enqueues them by dotted path
(``rq_epoch.demo.jobs.work``, see :mod:`rq_epoch.demo.common`).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rq.worker import Worker as RQWorker

__all__ = ['DEMO_MARKER', 'ShortLeaseStockWorker', 'poison_pill', 'work']

#: Environment variable set on every process the demo starts (value: the run's token).
DEMO_MARKER = 'RQ_EPOCH_DEMO_TOKEN'
#: Lease margin, in seconds, of :class:`ShortLeaseStockWorker` (RQ's is 60).
STOCK_MARGIN_ENV = 'RQ_EPOCH_DEMO_STOCK_MARGIN'


def _record(log_path: str, event: str, tag: str) -> None:
    """Append one event of a job (start, end) to the job log, with its PID."""
    line = f'{time.time():.3f} {event} {tag} {os.getpid()}\n'
    with open(log_path, 'a', encoding='utf-8') as fh:
        fh.write(line)


def work(log_path: str, tag: str, seconds: float) -> str:
    """A healthy job: record its start, work for ``seconds``, record its end."""
    _record(log_path, 'start', tag)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    _record(log_path, 'end', tag)
    return tag


def poison_pill(log_path: str, tag: str) -> None:
    """A job that takes its whole worker down, as an out-of-memory kill would.

    It SIGKILLs its worker and itself, but only inside a worker started by the demo
    (the demo's marker is in the environment); anywhere else it just raises.
    """
    _record(log_path, 'start', tag)
    if not os.environ.get(DEMO_MARKER):
        raise RuntimeError('poison_pill only takes down workers started by rq-epoch demo')
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class ShortLeaseStockWorker(RQWorker):
    """RQ's stock worker with one change: its lease margin is seconds instead of 60.

    RQ adds 60 seconds to every lease; the demo cuts that margin (``RQ_EPOCH_DEMO_STOCK_MARGIN``,
    default 2) so that the stock story fits in a minute. Nothing else differs from ``rq.Worker``.
    """

    def get_heartbeat_ttl(self, job: Any, *args: Any, **kwargs: Any) -> int:
        """RQ's heartbeat TTL with the demo's margin in place of RQ's 60 s."""
        margin = int(os.environ.get(STOCK_MARGIN_ENV, '2'))
        return int(super().get_heartbeat_ttl(job, *args, **kwargs)) - 60 + margin
