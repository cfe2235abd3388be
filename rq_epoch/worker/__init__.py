"""The worker: RQ's worker whose every execution holds a stamped lease.

:mod:`.worker` is the Worker, on :mod:`.heartbeats` (lease keeping) on :mod:`.outcomes`
(outcomes fenced by :mod:`.fence`); :mod:`.take` and :mod:`.tickets` are how idle workers
wait and which one sweeps; :mod:`.failover` follows the primary; :mod:`.flavours` are the
Simple, Spawn and Heroku variants.

``rq_epoch.worker`` was one module before; the names it offered are still here.
"""

from .failover import PrimaryWatch
from .flavours import HerokuWorker, SimpleWorker, SpawnWorker
from .worker import Worker, wait_while_unavailable

__all__ = ['HerokuWorker', 'PrimaryWatch', 'SimpleWorker', 'SpawnWorker', 'Worker', 'wait_while_unavailable']
