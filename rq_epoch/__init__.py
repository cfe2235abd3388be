"""rq-epoch: restart-aware stall accounting for RQ.

Every lease a worker holds is stamped with the run_id of the server process that granted
it. The sweep that recovers expired leases requeues leases that crossed a server restart
or failover without counting them, counts only real worker deaths, and dead-letters a job
that keeps killing its workers.
"""

from .epoch import is_counted, is_exempt, is_valid_run_id
from .errors import (
    ConfigurationError,
    EpochUnavailableError,
    OutcomeRefused,
    RqEpochError,
    ServerOutageError,
    StalledJobError,
)
from .failover import PrimaryWatch
from .fence import Fence
from .flavours import HerokuWorker, SimpleWorker, SpawnWorker
from .job import EpochJobMixin, Job
from .jobclass import epoch_job_class, is_epoch_job_class
from .queue import Queue
from .registry import StartedJobRegistry
from .report import LeaseVerdict, SweepReport
from .server import PrimaryState, ServerEpoch, read_epoch, read_primary_state
from .settings import EpochSettings
from .sweep import Sweeper
from .verdicts import Verdict
from .worker import Worker

#: The one place the version is written: setup.cfg reads it (``version = attr: rq_epoch.__version__``).
__version__ = '0.3.0.dev0'

__all__ = [
    'ConfigurationError',
    'EpochJobMixin',
    'EpochSettings',
    'EpochUnavailableError',
    'Fence',
    'HerokuWorker',
    'Job',
    'LeaseVerdict',
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
