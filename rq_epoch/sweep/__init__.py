"""The sweep: recovers expired leases by the epoch rule, dead-letters the jobs that keep
killing their workers (:mod:`.deadletters`), and releases their dependents (:mod:`.dependents`).

``rq_epoch.sweep`` was one module before; the names it offered are still here.
"""

from ..protocol.report import LeaseVerdict, SweepReport
from ..protocol.server import REPLICA_MAX_LAG, PrimaryState, ServerEpoch, primary_state, read_epoch, read_primary_state
from .deadletters import DeadLetters
from .sweeper import Sweeper

__all__ = [
    'REPLICA_MAX_LAG',
    'DeadLetters',
    'LeaseVerdict',
    'PrimaryState',
    'ServerEpoch',
    'SweepReport',
    'Sweeper',
    'primary_state',
    'read_epoch',
    'read_primary_state',
]
