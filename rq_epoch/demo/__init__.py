"""``rq-epoch demo``: the same story played by rq-epoch workers and by stock RQ workers.

* :mod:`~rq_epoch.demo.runner`: the server, both stories, the ledgers, the cleanup;
* :mod:`~rq_epoch.demo.story`: one story (its acts, its workers, its clock);
* :mod:`~rq_epoch.demo.ledger`: what happened to every job, and the printed ledgers;
* :mod:`~rq_epoch.demo.processes`: the server and ``rq worker`` processes the demo starts;
* :mod:`~rq_epoch.demo.jobs`: the job functions the demo's workers run.
"""

from __future__ import annotations

from .common import DemoError
from .runner import run_demo

__all__ = ['DemoError', 'run_demo']
