"""Workers that leave one part of rq-epoch out, to show what that part costs a job.

Used by ``python -m benchmarks.worker_throughput --parts``: each runs beside stock RQ and
rq-epoch in the same run, as ``rq worker --worker-class benchmarks.parts.<name>``. They are
measuring instruments, not workers to deploy: each drops what its part guarantees.
"""

from __future__ import annotations

from rq import Worker as RQWorker

import rq_epoch

__all__ = ['BESIDE', 'PARTS', 'UNFENCED', 'StockWorkerBesideEpoch', 'UnfencedWorker']


class StockWorkerBesideEpoch(RQWorker):
    """RQ's own worker, in a process that has imported all of rq-epoch.

    Its work-horses are forks of a process as large as rq-epoch's worker; nothing else
    differs from stock. What the size of the process costs each fork shows here.
    """


class UnfencedWorker(rq_epoch.Worker):
    """rq-epoch's worker whose outcomes are not fenced.

    RQ's own ``cleanup_execution``: the outcome's transaction is sent as RQ sends it
    (``MULTI``/``EXEC``), not through the commit script, so an outcome would land after a
    sweep took the lease. Everything else (the grant, the lease, the sweeps) is rq-epoch's.
    """

    cleanup_execution = RQWorker.cleanup_execution


#: The sides' names in the benchmark's results.
BESIDE = 'stock beside rq-epoch'
UNFENCED = 'rq-epoch unfenced'
#: Side name -> the worker class that ``rq worker`` loads for it.
PARTS = {
    BESIDE: 'benchmarks.parts.StockWorkerBesideEpoch',
    UNFENCED: 'benchmarks.parts.UnfencedWorker',
}
