"""Job and worker classes as applications write them (importable as ``tests.jobclasses``)."""

from __future__ import annotations

from typing import Any

from rq.job import Job as StockJob

from rq_epoch import Worker


class TracedJob(StockJob):
    """A job class derived from RQ's Job (not from rq_epoch.Job), with behaviour of its own."""

    def perform(self) -> Any:
        self.connection.rpush(f'test:traced:{self.id}', type(self).__qualname__)
        return super().perform()


class TracedWorker(Worker):
    """A worker subclass that names its job class as a class attribute."""

    job_class = TracedJob


class NotAJob:
    """Not derived from RQ's Job."""
