"""rq-epoch's worker waiting for jobs by polling (client tracking off): the alternative measured.

``rq worker --worker-class benchmarks._polling_worker.PollingWorker``: the same take, but an
idle worker runs it every ``Taker.poll_interval`` seconds instead of waiting for the
server's invalidation message. :mod:`benchmarks.pickup` measures it beside the real one to
show what the blocking wait saves.
"""

from __future__ import annotations

from rq_epoch import Worker
from rq_epoch.take import Taker


class PollingTaker(Taker):
    """The take, with the wait by polling."""

    tracking = False


class PollingWorker(Worker):
    """rq-epoch's worker whose idle wait polls."""

    taker_class = PollingTaker
