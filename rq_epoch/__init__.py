"""rq-epoch: restart-aware stall accounting for RQ.

Every lease a worker holds is stamped with the run_id of the server process that granted
it. The sweep that recovers expired leases requeues leases that crossed a server restart
or failover without counting them, counts only real worker deaths, and dead-letters a job
that keeps killing its workers.
"""

from .errors import (
    ConfigurationError,
    EnqueueNotConfirmed,
    EpochUnavailableError,
    OutcomeInterrupted,
    OutcomeRefused,
    RqEpochError,
    ServerOutageError,
    StalledJobError,
    UnsupportedServerError,
)
from .jobs.job import EpochJobMixin, Job, StartedJobRegistry
from .jobs.jobclass import epoch_job_class, is_epoch_job_class
from .jobs.queue import Queue
from .protocol.epoch import is_counted, is_exempt, is_valid_run_id
from .protocol.report import LeaseVerdict, SweepReport
from .protocol.server import PrimaryState, ServerEpoch, read_epoch, read_primary_state
from .protocol.verdicts import Verdict
from .settings import EpochSettings
from .sweep import DeadLetters, Sweeper
from .worker import HerokuWorker, PrimaryWatch, SimpleWorker, SpawnWorker, Worker
from .worker.fence import Fence

# The layers, put together: the started registry's cleanup is the sweep, a layer above the
# registry's (see "The layers" in docs/design.md).
StartedJobRegistry.sweeper_class = Sweeper

#: The one place the version is written: setup.cfg reads it (``version = attr: rq_epoch.__version__``).
__version__ = '0.3.0.dev0'

__all__ = [
    'ConfigurationError',
    'DeadLetters',
    'EpochJobMixin',
    'EnqueueNotConfirmed',
    'EpochSettings',
    'EpochUnavailableError',
    'Fence',
    'HerokuWorker',
    'Job',
    'LeaseVerdict',
    'OutcomeInterrupted',
    'OutcomeRefused',
    'PrimaryState',
    'PrimaryWatch',
    'Queue',
    'RqEpochError',
    'ServerEpoch',
    'ServerOutageError',
    'SimpleWorker',
    'SpawnWorker',
    'StalledJobError',
    'StartedJobRegistry',
    'SweepReport',
    'Sweeper',
    'UnsupportedServerError',
    'Verdict',
    'Worker',
    'epoch_job_class',
    'is_counted',
    'is_epoch_job_class',
    'is_exempt',
    'is_valid_run_id',
    'read_epoch',
    'read_primary_state',
]
