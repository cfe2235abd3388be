"""RQ's Job with the lease epoch and the stall counters, and the started registry of its leases.

The two are one module because each names the other: a job registers its executions in
:class:`StartedJobRegistry`, whose default job class is :class:`Job`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from rq.job import Job as RQJob
from rq.registry import StartedJobRegistry as RQStartedJobRegistry

from ..adapters import rq as rq_adapter
from ..compat import optional_text
from ..errors import CONNECTION_ERRORS, ConfigurationError
from ..protocol import keys, scripts

if TYPE_CHECKING:
    from redis.client import Pipeline
    from rq.executions import Execution

    from ..sweep.sweeper import Sweeper
    from ..worker.fence import Fence

logger = logging.getLogger('rq_epoch')

__all__ = ['EpochJobMixin', 'Job', 'StartedJobRegistry', 'stalled_count']


def _int(raw: Any, default: int | None) -> int | None:
    text = optional_text(raw)
    if text is None or text == '':
        return default
    try:
        return int(text)
    except ValueError:
        return default


def _field(raw_data: Any, name: str) -> Any:
    if name in raw_data:
        return raw_data[name]
    return raw_data.get(name.encode())


#: The fields :meth:`EpochJobMixin.restore` reads, as text and as bytes (a hash read with or
#: without ``decode_responses``).
_RESTORED = (
    'lease_epoch',
    'lease_execution',
    'stalled',
    'status',
    'stall_dead',
    'exempt_recoveries',
    'stale_outcomes',
    'max_stalled',
)
_RESTORED_BYTES = tuple(name.encode() for name in _RESTORED)


def _restored_fields(raw_data: Any) -> list[Any]:
    """The raw values of :data:`_RESTORED` in a job hash, in that order (None when absent).

    A hash's keys are all bytes or all text, so the first one tells which names to look up:
    one lookup per field instead of two for every field a job does not have.
    """
    names = _RESTORED if isinstance(next(iter(raw_data), b''), str) else _RESTORED_BYTES
    get = raw_data.get
    return [get(name) for name in names]


def stalled_count(stalled: Any, status: Any, stall_dead: Any) -> int:
    """Counted stalls of a job, from the raw ``stalled``, ``status`` and ``stall_dead`` fields of its hash.

    The one rule every reader uses (:class:`Job`, ``rq-epoch status``, the metrics): a dead
    letter that was requeued by hand, with any tool, starts afresh at 0, even before its
    next grant resets the field in the server.
    """
    if stall_dead is not None and optional_text(status) != 'failed':
        return 0
    return _int(stalled, 0) or 0


if TYPE_CHECKING:
    _MixinBase = RQJob
else:
    _MixinBase = object


class EpochJobMixin(_MixinBase):
    """The epoch behaviour of a job, for any class derived from RQ's Job.

    :class:`rq_epoch.Job` is this mixin on RQ's Job; :func:`rq_epoch.epoch_job_class`
    puts it on any other job class at run time. The defaults below are class attributes
    so that a job object made by another class can be given the behaviour in place
    (see :func:`rq_epoch.jobs.jobclass.adopt`).
    """

    lease_epoch: str | None = None
    lease_execution: str | None = None
    stalled: int = 0
    exempt_recoveries: int = 0
    stale_outcomes: int = 0
    _max_stalled: int | None = None
    #: The execution this process runs the job under (set by the worker), or None.
    fence: Fence | None = None
    #: True once the fence refused this process's outcome of the job.
    outcome_refused: bool = False
    #: True when the grant of this process's execution was lost before a replica confirmed
    #: it (``RQ_EPOCH_DURABLE_REPLICAS``): the worker does not run the job.
    grant_lost: bool = False
    #: True between the worker's fenced preparation of the job and RQ's own call of it,
    #: which then has nothing left to write (see :meth:`rq_epoch.Worker.perform_job`).
    prepared: bool = False
    #: Set by rq-epoch's workers when outcomes are confirmed by replicas
    #: (``RQ_EPOCH_DURABLE_REPLICAS``): the ``on_success`` / ``on_failure`` callback is not run
    #: where RQ calls it, before the outcome is written, but kept in :attr:`deferred_callback`
    #: for the worker to run once the outcome is confirmed.
    defer_callbacks: bool = False
    #: The callback RQ called while :attr:`defer_callbacks` was set, with its arguments, and its name.
    deferred_callback: tuple[str, Callable[[], Any]] | None = None
    _heartbeat_registry: StartedJobRegistry | None = None
    _callback_decisions: dict[tuple[str, str], bool] | None = None
    #: Set by rq-epoch's workers on the job they run: calls :meth:`perform` again after a
    #: server outage in RQ's step before the job function. None: RQ's behaviour.
    ride_out: Callable[[Callable[[], Any]], Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lease_epoch = None
        self.lease_execution = None
        self.stalled = 0
        self.exempt_recoveries = 0
        self.stale_outcomes = 0
        self._max_stalled = None
        self.fence = None
        self.outcome_refused = False
        self.grant_lost = False
        self.prepared = False
        self.defer_callbacks = False
        self.deferred_callback = None
        self._callback_decisions = {}
        super().__init__(*args, **kwargs)

    @property
    def max_stalled(self) -> int | None:
        """This job's stall budget, or None to use the sweeper's default."""
        return self._max_stalled

    @max_stalled.setter
    def max_stalled(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigurationError(f'max_stalled must be a whole number of at least 1, got {value!r}')
        self._max_stalled = value

    def restore(self, raw_data: Any) -> Any:
        result = super().restore(raw_data)
        epoch, execution, stalled, status, stall_dead, exempt, stale, max_stalled_raw = _restored_fields(raw_data)
        self.lease_epoch = optional_text(epoch)
        self.lease_execution = optional_text(execution)
        # Dead-lettered, then requeued by hand (with any tool): the budget starts afresh,
        # and the next grant resets the counter in the server too.
        self.stalled = stalled_count(stalled, status, stall_dead)
        self.exempt_recoveries = _int(exempt, 0) or 0
        self.stale_outcomes = _int(stale, 0) or 0
        max_stalled = _int(max_stalled_raw, None)
        self._max_stalled = max_stalled if max_stalled is not None and max_stalled >= 1 else None
        return result

    def to_dict(self, include_meta: bool = True, include_result: bool = True) -> dict:
        data = super().to_dict(include_meta=include_meta, include_result=include_result)
        if self._max_stalled is not None:
            data['max_stalled'] = self._max_stalled
        return data

    # -- running ----------------------------------------------------------------------

    def perform(self) -> Any:
        """Run the job as RQ does; a server outage in RQ's step before the job function does not fail it.

        RQ 2's ``Job.perform`` removes the job key's expiry (``PERSIST``) before it calls the
        function. A connection error there is not the job's: with :attr:`ride_out` set
        (rq-epoch's workers set it) it is tried again with the worker's backoff, and
        ``perform`` runs again from the start (a job class's own ``perform`` too). Any other
        error, a connection error raised by the function or by a job class's own code
        included, fails the job as in RQ. RQ 3's ``Job.perform`` calls no server before the
        function: there this changes nothing.
        """
        ride_out = self.ride_out
        if ride_out is None:
            return super().perform()
        try:
            return ride_out(self._perform_once)
        except _JobsOwnError as raised:
            raise raised.error from None

    def _perform_once(self) -> Any:
        try:
            return super().perform()
        except CONNECTION_ERRORS as exc:
            # RQ's step: raised in RQ's perform, before it called the function (its _execute).
            if not rq_adapter.raised_before_job_function(exc):
                raise _JobsOwnError(exc) from exc  # not retried: the job's, as in RQ
            raise

    # -- fenced side effects ----------------------------------------------------------

    def _callback_allowed(self, callback: Any, name: str) -> bool:
        """Whether ``callback`` may run: always, unless this execution is known to be stale.

        The answer is kept per callback and execution: RQ 2 reads the property twice
        (to test it, then to call it), and both reads must agree.
        """
        if callback is None or self.fence is None:
            return True
        decisions = self._callback_decisions
        if decisions is None:  # a job adopted in place: its __init__ did not run
            decisions = self._callback_decisions = {}
        decided = decisions.get((name, self.fence.execution_id))
        if decided is not None:
            return decided
        if self.outcome_refused:
            refusal: Any = 'its outcome was refused'
        else:
            refusal = self.fence.check(self.connection)
        decisions[(name, self.fence.execution_id)] = refusal is None
        if refusal is None:
            return True
        logger.warning(
            'Job %s: not running its %s callback from execution %s: %s',
            self.id,
            name,
            self.fence.execution_id,
            refusal,
        )
        return False

    def _deferred(self, callback: Any, name: str) -> Any:
        """``callback``, or, with :attr:`defer_callbacks`, a stand-in that keeps the call for later.

        RQ calls the stand-in where it would call the callback (before the outcome is written);
        the worker runs what it kept once replicas confirmed the outcome. A coroutine callback
        is left to RQ, which refuses it.
        """
        if callback is None or not self.defer_callbacks or inspect.iscoroutinefunction(callback):
            return callback

        def keep(*args: Any) -> None:
            self.deferred_callback = (name, functools.partial(callback, *args))

        return keep

    @property
    def success_callback(self) -> Any:
        callback = super().success_callback
        return self._deferred(callback, 'on_success') if self._callback_allowed(callback, 'on_success') else None

    @property
    def failure_callback(self) -> Any:
        callback = super().failure_callback
        return self._deferred(callback, 'on_failure') if self._callback_allowed(callback, 'on_failure') else None

    @property
    def stopped_callback(self) -> Any:
        callback = super().stopped_callback
        return callback if self._callback_allowed(callback, 'on_stopped') else None

    def send_webhooks(self, *args: Any, **kwargs: Any) -> None:
        """RQ's webhooks, except for an outcome that the fence refused."""
        if self.outcome_refused:
            return
        super().send_webhooks(*args, **kwargs)

    @property
    def started_job_registry(self) -> StartedJobRegistry:  # type: ignore[override]
        return StartedJobRegistry(
            self.origin, connection=self.connection, job_class=self.__class__, serializer=self.serializer
        )

    @property
    def heartbeat_registry(self) -> StartedJobRegistry:
        """The started registry this job object's heartbeats use, built at the first one.

        RQ builds a new registry at every heartbeat (:attr:`started_job_registry`), which
        resolves the serializer each time (~10 µs); a running job's queue does not change.
        """
        registry = self._heartbeat_registry
        if registry is None or registry.name != self.origin:
            registry = self._heartbeat_registry = self.started_job_registry
        return registry

    def __eq__(self, other: object) -> bool:
        """RQ's equality (same id, an instance of the job's class), with the epoch layer transparent.

        A job of the epoch variant of a class equals a job of that class with the same id.
        """
        base = type(self).__dict__.get('_rq_epoch_base')
        if base is None:
            return bool(super().__eq__(other))
        if base.__eq__ is not RQJob.__eq__:
            return bool(base.__eq__(self, other))
        return isinstance(other, base) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)


class _JobsOwnError(Exception):
    """Carries a connection error of the job's own past the ride-out's retries."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class Job(EpochJobMixin, RQJob):
    """An RQ job whose lease is stamped with the server epoch.

    Attributes read from the job hash (written only by rq-epoch's scripts):

    * ``lease_epoch``: run_id of the server process that last granted or extended the lease.
    * ``lease_execution``: the execution that holds the lease.
    * ``stalled``: counted stalls so far.
    * ``exempt_recoveries``: requeues after leases that crossed a restart (not counted).
    * ``stale_outcomes``: outcomes of stale executions that the fence refused.

    Set by you at enqueue time (see :class:`rq_epoch.Queue`):

    * ``max_stalled``: this job's stall budget; None uses the sweeper's setting.

    ``save()`` never writes the stamp or the counters, so a stale copy of a job can't
    clobber what the scripts wrote.

    While a worker runs the job, :attr:`fence` names the execution that holds its lease:
    the job's ``on_success`` / ``on_failure`` / ``on_stopped`` callbacks are then looked up
    only while that execution still holds it, and webhooks are not sent for an outcome
    that the fence refused.

    A job class of your own gets the same behaviour by deriving from this class, or from
    RQ's Job alone (see :func:`rq_epoch.epoch_job_class`).
    """

    _rq_epoch_base = RQJob


#: RQ's score for "never expires"; stock cleanup ignores such entries.
NO_EXPIRY = '+inf'


class StartedJobRegistry(RQStartedJobRegistry):
    """The registry of running jobs, whose expiry is rq-epoch's business.

    The entry in RQ's ``<prefix>:wip:<queue>`` keeps RQ's "no expiry" score, so no stock
    cleanup (``rq info``, dashboards, stock workers) can fail or retry a managed job. The
    lease deadline lives in ``<prefix>:epoch:lease:<queue>`` (one entry per job, named by
    the job id; the job's ``lease_execution`` says which execution holds it), written with
    the stamp by the grant and extend scripts, and :meth:`cleanup` is the epoch-aware sweep.
    """

    job_class = Job
    #: What :meth:`cleanup` runs: :class:`rq_epoch.Sweeper`. The sweep is the layer above
    #: this module (it fetches and requeues jobs of its classes), so this module does not
    #: import it: ``rq_epoch/__init__.py``, which puts the layers together, sets it.
    sweeper_class: ClassVar[type[Sweeper]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leases_key = keys.leases_key(self.name)
        #: Index, in the pipeline, of the extend script queued by the last heartbeat.
        self.extend_index: int | None = None

    def add_execution(self, execution: Execution, pipeline: Pipeline, ttl: int = 0, xx: bool = False) -> int:
        """Register an execution: RQ's entry with no expiry, and the stamped lease.

        Without ``xx`` (an execution starting) RQ's entry is written and the grant script
        queued; with ``xx`` (a heartbeat) only the extend script is, which also gives RQ's
        entry its "no expiry" score again, so that a heartbeat sends no more commands than
        RQ's own. :attr:`extend_index` says where the extend script's answer is. Both
        scripts also note the server alive as primary (at most once a second per server; see
        ``note_alive`` in ``lua/_epoch.lua``), in the same command.
        """
        lease_args = [execution.job_id, max(int(ttl), 1), execution.id, keys.PREFIX]
        if xx:
            self.extend_index = len(pipeline)
            scripts.extend().queue(pipeline, self.extend_keys(execution.job_id), lease_args)
        else:
            pipeline.zadd(self.key, {execution.composite_key: NO_EXPIRY})
            scripts.grant().queue(pipeline, self.grant_keys(execution.job_id), lease_args)
        return 0

    def extend_keys(self, job_id: str) -> list[str]:
        """KEYS of the extend script for a job of this queue: the lease, the job, RQ's entry."""
        return [self.leases_key, keys.job_key(job_id), self.key]

    def grant_keys(self, job_id: str) -> list[str]:
        """KEYS of the grant script for a job of this queue.

        Besides the lease and the job, the grant removes the job's entry from RQ's
        intermediate list (where the take left it) and its first sighting by a sweep, and
        RQ's registry entry of the execution whose lease it replaces, if any; when the
        take's entry is missing (a failover lost the take), the job's entry in its queue.
        """
        return [
            self.leases_key,
            keys.job_key(job_id),
            keys.intermediate_key(self.name),
            keys.limbo_key(self.name),
            self.key,
            keys.queue_key(self.name),
        ]

    def remove_execution(
        self,
        execution: Execution,
        job: RQJob | None = None,
        pipeline: Pipeline | None = None,
        delete_job: bool = False,
    ) -> None:
        """Remove RQ's entry and the lease of an execution that ended.

        The lease is the job's (member: the job id). An outcome's transaction, where RQ
        calls this, is fenced (:mod:`rq_epoch.worker.fence`): it runs only while this execution
        holds the lease, so a newer execution's lease is never removed by an older one.
        """
        super().remove_execution(execution, job=job, pipeline=pipeline, delete_job=delete_job)
        connection = pipeline if pipeline is not None else self.connection
        connection.zrem(self.leases_key, execution.job_id)

    def cleanup(self, timestamp: float | None = None, exception_handlers: list | None = None) -> None:
        """Run the epoch-aware sweep on this queue (instead of RQ's abandoned-job cleanup).

        ``timestamp`` is ignored: expiry is judged by the server clock.
        """
        sweeper = self.sweeper_class(
            self.connection,
            job_class=self.job_class,
            serializer=self.serializer,
            exception_handlers=exception_handlers,
        )
        sweeper.sweep([self.name])
