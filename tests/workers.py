"""Worker classes for tests that need a worker to die at an exact point."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from rq.queue import Queue as StockQueue
from rq.worker import Worker as StockWorker

from rq_epoch import Sweeper, Worker
from rq_epoch.worker.take import Taker, TakerCounters


class EpochWorkerDiesAfterDequeue(Worker):
    """Takes a job from the queue, then is SIGKILLed before starting it."""

    def prepare_execution(self, job: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


class _TakerDiesAfterTake(Taker):
    def taken(self, queue: Any, job_id: str) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class EpochWorkerDiesAfterTake(Worker):
    """Is SIGKILLed right after the take script moved a job, before the reply is used."""

    taker_class = _TakerDiesAfterTake


class _PrintedCounters(TakerCounters):
    """Prints each change of a counter: ``COUNTER <name> <value>`` (the tests read the worker's log)."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        print(f'COUNTER {name} {value}', flush=True)


class _CountingTaker(Taker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counters = _PrintedCounters()


class EpochWorkerCountingWakes(Worker):
    """rq-epoch's worker, printing its taker's counters (wake-ups, empty takes, watch terms)
    and its asks for sweep tickets (``COUNTER ticket_asks <n>``)."""

    taker_class = _CountingTaker
    ticket_asks = 0

    def sweep(self) -> Any:
        self.ticket_asks += 1
        print(f'COUNTER ticket_asks {self.ticket_asks}', flush=True)
        return super().sweep()


class StockQueueDiesAfterPop(StockQueue):
    """Stock RQ's queue class; the worker using it is SIGKILLed right after a pop returned a job."""

    @classmethod
    def lpop(cls, *args: Any, **kwargs: Any) -> Any:
        result = super().lpop(*args, **kwargs)
        if result is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


class StockWorkerDiesAfterDequeue(StockWorker):
    """Stock RQ's worker, SIGKILLed at the same point."""

    def prepare_execution(self, job: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


class SweeperDiesBeforeSideEffects(Sweeper):
    """Is SIGKILLed after the sweep script returned a dead verdict, before the side effects."""

    def before_finish(self, verdicts: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == '__main__':  # python -m tests.workers URL QUEUE: run the dying sweeper
    import redis

    SweeperDiesBeforeSideEffects(redis.Redis.from_url(sys.argv[1]), restart_grace=0).sweep([sys.argv[2]])
