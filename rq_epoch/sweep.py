"""The epoch-aware sweep: verdicts for expired leases, and the finishing of dead letters."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.exceptions import NoPermissionError, ResponseError, WatchError
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import resolve_serializer
from rq.timeouts import BaseDeathPenalty, UnixSignalDeathPenalty
from rq.utils import now

from . import compat, epoch, keys, scripts
from .compat import text
from .errors import EpochUnavailableError, StalledJobError
from .job import Job
from .jobclass import resolve_job_class
from .queue import Queue
from .settings import EpochSettings
from .verdicts import Verdict

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    'LeaseVerdict',
    'PrimaryState',
    'ServerEpoch',
    'SweepReport',
    'Sweeper',
    'read_epoch',
    'read_primary_state',
]

logger = logging.getLogger('rq_epoch')


@dataclass(frozen=True)
class ServerEpoch:
    """The server process the sweep talks to: its run_id, uptime and role."""

    run_id: str
    uptime: int
    role: str = ''


def read_epoch(connection: Redis, *, with_role: bool = True) -> ServerEpoch:
    """Read the current epoch with INFO server, for start-up checks and status views.

    ``with_role=False`` skips the extra INFO replication round trip (the sweep needs no role).

    Raises:
        EpochUnavailableError: INFO is refused (ACL) or has no valid run_id.
    """
    try:
        info = connection.info('server')
    except ResponseError as exc:
        if isinstance(exc, NoPermissionError) or str(exc).startswith('NOPERM'):
            raise EpochUnavailableError(
                'the server user may not run INFO (grant it with the ACL rule +info); '
                f'rq-epoch needs INFO server to read the run_id: {exc}'
            ) from exc
        raise
    run_id = info.get('run_id')
    if not epoch.is_valid_run_id(str(run_id) if run_id is not None else None):
        raise EpochUnavailableError(
            f'INFO server answered without a valid run_id ({run_id!r}); rq-epoch needs the '
            '40-character run_id of the server process (is a proxy hiding it?)'
        )
    role = ''
    if with_role:
        try:
            role = str(connection.info('replication').get('role', ''))
        except ResponseError:
            pass
    return ServerEpoch(run_id=str(run_id), uptime=int(info.get('uptime_in_seconds', 0)), role=role)


@dataclass(frozen=True)
class PrimaryState:
    """What the sweep script saw of the server's role, as recorded in ``<prefix>:epoch:primaries``."""

    #: INFO replication ``role``: ``master`` for a primary, ``slave`` for a replica.
    role: str = ''
    #: Seconds this server process has been serving the dataset as primary (restart or
    #: promotion), by the server clock; 0 when this sweep was the first to see it.
    age: float = 0.0
    #: Server time at which a script first saw this process as primary (0: not recorded yet).
    first_seen: float = 0.0
    #: Replicas connected and online now.
    replicas_online: int = 0
    #: Most replicas seen online while this process has been primary.
    replicas_expected: int = 0

    @property
    def is_primary(self) -> bool:
        return self.role == 'master'

    @property
    def isolated(self) -> bool:
        """A primary that had replicas in its epoch and has none online now (demoted or cut off)."""
        return self.is_primary and self.replicas_expected > 0 and self.replicas_online == 0

    @property
    def judges(self) -> bool:
        """Whether a sweep on this server gives verdicts: a primary that is not isolated."""
        return self.is_primary and not self.isolated

    @property
    def state(self) -> str:
        """``primary``, ``isolated`` or ``replica`` (any role other than master)."""
        if not self.is_primary:
            return 'replica'
        return 'isolated' if self.isolated else 'primary'


#: A replica whose last acknowledgement is older than this is not counted online (seconds).
REPLICA_MAX_LAG = 10


def read_primary_state(connection: Redis, current: ServerEpoch | None = None) -> PrimaryState:
    """The server's role and primary epoch as the sweep script would see them; writes nothing.

    For status views: the same rule as ``primary_epoch`` in ``lua/_epoch.lua``, read
    from INFO replication and ``<prefix>:epoch:primaries`` with the server clock.
    """
    current = current or read_epoch(connection, with_role=False)
    with connection.pipeline(transaction=False) as pipeline:
        pipeline.info('replication')
        pipeline.hgetall(keys.primaries_key())
        pipeline.time()
        info, entries, (seconds, micros) = pipeline.execute()
    return primary_state(current, info, entries, float(seconds) + float(micros) / 1e6)


def primary_state(current: ServerEpoch, info: dict[str, Any], entries: dict[Any, Any], now: float) -> PrimaryState:
    """:class:`PrimaryState` from replies already read: INFO replication, HGETALL of
    ``<prefix>:epoch:primaries`` and the server TIME (``now``, seconds)."""
    role = str(info.get('role', ''))
    if role != 'master':
        return PrimaryState(role=role)
    online = 0
    for name, value in info.items():
        if str(name).startswith('slave') and isinstance(value, dict):
            if value.get('state') == 'online' and int(value.get('lag', 0) or 0) <= REPLICA_MAX_LAG:
                online += 1
    field_name = f'{current.run_id}:{info.get("master_replid", "")}'
    entry = next((value for name, value in entries.items() if text(name) == field_name), None)
    first, expected = 0.0, 0
    if entry:
        try:
            first_text, expected_text = text(entry).split(' ', 1)
            first, expected = float(first_text), int(expected_text)
        except ValueError:
            first, expected = 0.0, 0
    expected = max(expected, online)
    age = max(0.0, min(float(current.uptime), now - first)) if first else 0.0
    return PrimaryState(role=role, age=age, first_seen=first, replicas_online=online, replicas_expected=expected)


@dataclass(frozen=True)
class LeaseVerdict:
    """What the sweep decided for one expired lease."""

    queue: str
    member: str
    job_id: str
    verdict: Verdict
    stalled: int
    max_stalled: int
    lease_epoch: str
    run_id: str

    @property
    def counted(self) -> bool:
        """True when this verdict counted a stall (recovered or dead)."""
        return self.verdict.counted


@dataclass
class SweepReport:
    """Everything one sweep did, for the worker's log, the CLI, or your own monitoring."""

    run_id: str = ''
    #: Seconds the server process had been up when the last sweep script call ran.
    uptime: int = 0
    dry_run: bool = False
    queues: list[str] = field(default_factory=list)
    verdicts: list[LeaseVerdict] = field(default_factory=list)
    #: Dead letters whose side effects (result, callback, dependents) this sweep ran.
    finished: list[str] = field(default_factory=list)
    #: The server's role and primary epoch as the last script call saw them.
    primary: PrimaryState | None = None
    #: Script calls whose counted verdicts no replica acknowledged (``WAIT``) in time;
    #: the side effects of dead letters are not run by a sweep that has any.
    unconfirmed: int = 0

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Number of leases per verdict (every verdict listed, zeros included)."""
        counter = Counter(v.verdict for v in self.verdicts if queue is None or v.queue == queue)
        return {verdict.value: counter.get(verdict, 0) for verdict in Verdict}

    @property
    def total(self) -> int:
        """Leases given a verdict (deferred ones excluded)."""
        return sum(1 for v in self.verdicts if v.verdict.judged)

    def by_job(self, job_id: str) -> list[LeaseVerdict]:
        return [v for v in self.verdicts if v.job_id == job_id]

    @property
    def judged(self) -> bool:
        """False when the server was a replica or an isolated primary: nothing was judged."""
        return self.primary is None or self.primary.judges

    def merge(self, other: SweepReport) -> None:
        self.run_id = other.run_id or self.run_id
        self.uptime = other.uptime or self.uptime
        self.primary = other.primary or self.primary
        self.unconfirmed += other.unconfirmed
        self.queues.extend(q for q in other.queues if q not in self.queues)
        self.verdicts.extend(other.verdicts)
        self.finished.extend(other.finished)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: totals per queue and every verdict."""
        return {
            'run_id': self.run_id,
            'uptime': self.uptime,
            'dry_run': self.dry_run,
            'queues': {name: self.counts(name) for name in self.queues},
            'totals': self.counts(),
            'finished': list(self.finished),
            'verdicts': [asdict(v) for v in self.verdicts],
            'primary': None if self.primary is None else {**asdict(self.primary), 'state': self.primary.state},
            'unconfirmed': self.unconfirmed,
        }


#: The line reported by the records of :meth:`Sweeper.log_verdict`.
_LOG_VERDICT_LINE = 0


class Sweeper:
    """Runs the epoch-aware sweep over queues and finishes the jobs it dead-letters.

    Safe to run from any number of processes at once: each expired lease is judged by
    exactly one sweep script call, and each dead letter's side effects are claimed.

    Subclassing points: :meth:`failure_reason` (the text of a dead letter's failure),
    :meth:`log_verdict`, :meth:`log_dead_letter`, and :meth:`before_finish` (called after a script returned, before
    the side effects of its dead letters run; the tests use it to kill a sweeper there).

    ``job_class`` (the argument, else the class attribute) may be any class derived from
    RQ's Job; the sweep uses its epoch variant, and refuses any other class as the worker
    does (see :func:`rq_epoch.jobclass.resolve_job_class`).
    """

    job_class: type[Job] = Job
    queue_class: type[Queue] = Queue
    death_penalty_class: type[BaseDeathPenalty] = UnixSignalDeathPenalty
    #: Seconds to wait for a replica to acknowledge counted verdicts (``WAIT``).
    confirm_timeout: float = 1.0

    def __init__(
        self,
        connection: Redis,
        *,
        settings: EpochSettings | None = None,
        max_stalled: int | None = None,
        batch_size: int | None = None,
        restart_grace: int | None = None,
        job_class: type[RQJob] | str | None = None,
        serializer: Any = None,
        failure_ttl: int = DEFAULT_FAILURE_TTL,
        claim_ttl: int = 300,
        rescue_intermediate: bool = True,
        exception_handlers: Sequence[Callable[..., Any]] | None = None,
        death_penalty_class: type[BaseDeathPenalty] | None = None,
    ) -> None:
        base = settings or EpochSettings.resolve()
        self.settings = EpochSettings.resolve(
            environ={},
            max_stalled=max_stalled if max_stalled is not None else base.max_stalled,
            heartbeat_interval=base.heartbeat_interval,
            lease_margin=base.lease_margin,
            sweep_interval=base.sweep_interval,
            restart_grace=restart_grace if restart_grace is not None else base.restart_grace,
            batch_size=batch_size if batch_size is not None else base.batch_size,
        )
        self.connection = connection
        self.job_class = resolve_job_class(type(self), job_class)
        self.serializer = resolve_serializer(serializer)
        self.failure_ttl = failure_ttl
        self.claim_ttl = claim_ttl
        self._last_run_id = ''
        self._last_uptime = 0
        self._last_primary: PrimaryState | None = None
        #: Requeue jobs stranded in RQ's intermediate queue after one lease length.
        self.rescue_intermediate = rescue_intermediate
        self.exception_handlers = list(exception_handlers or [])
        if death_penalty_class is not None:
            self.death_penalty_class = death_penalty_class

    # -- the sweep -------------------------------------------------------------------

    def sweep(
        self,
        queue_names: Iterable[str],
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> SweepReport:
        """Judge every expired lease of the given queues, in bounded batches.

        Dead letters are finished (result, callback, dependents) before this returns,
        including any left unfinished by a sweeper that died. ``progress`` is called with
        the number of leases judged by each script call.

        Raises:
            EpochUnavailableError: the server yields no valid run_id (nothing is written).
        """
        names = list(queue_names)
        report = SweepReport(dry_run=dry_run)
        if not names:  # no script call will read the epoch: check it here
            current = read_epoch(self.connection, with_role=False)
            report.run_id, report.uptime = current.run_id, current.uptime
        if names:
            with self._pinned() as client:
                for name in names:
                    report.queues.append(name)
                    self._sweep_queue(name, report, dry_run, progress, client)
        if not dry_run:
            if report.judged and not report.unconfirmed:
                self.finish_dead_letters(report)
            elif report.unconfirmed:
                logger.warning(
                    'sweep: no replica acknowledged %d call(s) with counted verdicts within %.1fs; the side effects '
                    'of dead letters wait for a sweep on a primary whose replica has them',
                    report.unconfirmed,
                    self.confirm_timeout,
                )
        return report

    def _sweep_queue(
        self,
        name: str,
        report: SweepReport,
        dry_run: bool,
        progress: Callable[[int], None] | None,
        client: Redis | None = None,
    ) -> None:
        # Entries a call read and left in place (deferred ones; every one in a dry run)
        # stay at the front of the expired range: the next call skips them, so each lease
        # is reported once per sweep and those behind a batch of deferred ones are judged.
        lease_offset = stock_offset = 0
        # Every call either removes what it judged or moves an offset forward, so this
        # ends; the bound only guards against a server that keeps answering "more".
        for _ in range(1_000_000):
            verdicts, more, left_leases, left_stock = self._call(name, dry_run, lease_offset, stock_offset, client)
            self._take_verdicts(name, verdicts, report, dry_run, progress, client)
            if not more or (left_leases + left_stock == 0 and not verdicts):
                break
            lease_offset += left_leases
            stock_offset += left_stock
        if self.rescue_intermediate:
            verdicts = self._rescue(name, dry_run, client)
            self._take_verdicts(name, verdicts, report, dry_run, progress, client)

    def _take_verdicts(
        self,
        name: str,
        verdicts: list[LeaseVerdict],
        report: SweepReport,
        dry_run: bool,
        progress: Callable[[int], None] | None,
        client: Redis | None,
    ) -> None:
        """Add one script call's verdicts to the report, log them, and confirm counted ones."""
        if not dry_run and not self._confirmed(client or self.connection, verdicts):
            report.unconfirmed += 1
        report.run_id, report.uptime = self._last_run_id, self._last_uptime
        report.primary = self._last_primary
        report.verdicts.extend(verdicts)
        if progress is not None and verdicts:
            progress(len(verdicts))
        if not dry_run:
            log = self.log_verdict
            logging_every = type(self).log_verdict is not Sweeper.log_verdict
            for verdict in verdicts:
                if logging_every or logger.isEnabledFor(verdict.verdict.level):
                    log(verdict)
            if any(v.verdict is Verdict.DEAD for v in verdicts):
                self.before_finish(verdicts)

    @contextmanager
    def _pinned(self) -> Iterator[Redis]:
        """A client that keeps one connection of the pool for a whole sweep, so that ``WAIT`` follows
        the script's writes on the same connection."""
        client = redis.Redis(connection_pool=self.connection.connection_pool, single_connection_client=True)
        try:
            yield client
        finally:
            client.close()

    def _confirmed(self, client: Redis, verdicts: list[LeaseVerdict]) -> bool:
        """Whether a replica has the counted verdicts of the last call, when the primary has replicas.

        A counted verdict (recovered, dead) written on a primary that was just demoted, or
        cut off from its replicas, vanishes when it resyncs; its side effects must not run.
        ``WAIT 1`` on the connection that ran the script tells: some replica acknowledged
        the writes within :attr:`confirm_timeout`. Without replicas there is nothing to wait for.
        """
        primary = self._last_primary
        if primary is None or not any(v.counted for v in verdicts):
            return True
        if primary.replicas_expected == 0 and primary.replicas_online == 0:
            return True
        try:
            acked = int(client.execute_command('WAIT', 1, int(self.confirm_timeout * 1000)))
        except ResponseError as exc:  # WAIT refused (an ACL): say so, and trust the script's own check
            logger.warning('sweep: WAIT refused (%s); counted verdicts are not confirmed by a replica', exc)
            return True
        return acked >= 1

    def _call(
        self, name: str, dry_run: bool, lease_offset: int, stock_offset: int, client: Redis | None = None
    ) -> tuple[list[LeaseVerdict], bool, int, int]:
        """One call of the sweep script: (verdicts, more, leases left in place, stock entries left in place)."""
        result = scripts.sweep()(
            client if client is not None else self.connection,
            [keys.leases_key(name), keys.wip_key(name), keys.finishing_key(), keys.stats_key(name)],
            [
                keys.PREFIX,
                name,
                self.settings.batch_size,
                self.settings.max_stalled,
                self.settings.grace,
                self.failure_ttl,
                '1' if dry_run else '0',
                lease_offset,
                stock_offset,
            ],
        )
        verdicts = self._verdicts(name, result, bare_ids=False)
        return verdicts, int(result[8]) == 1, int(result[9]), int(result[10])

    def _rescue(self, name: str, dry_run: bool, client: Redis | None = None) -> list[LeaseVerdict]:
        """One call of the rescue script: jobs stranded in RQ's intermediate list for a lease length."""
        result = scripts.rescue()(
            client if client is not None else self.connection,
            [keys.leases_key(name), keys.wip_key(name), keys.limbo_key(name), keys.stats_key(name)],
            [
                keys.PREFIX,
                name,
                self.settings.batch_size,
                self.settings.max_stalled,
                self.settings.lease_ttl,
                '1' if dry_run else '0',
            ],
        )
        return self._verdicts(name, result, bare_ids=True)

    def _verdicts(self, name: str, result: list[Any], *, bare_ids: bool) -> list[LeaseVerdict]:
        """Read the reply of a sweep verb (see ``lua/_sweep.lua``); remembers the epoch and role it saw.

        ``bare_ids``: the records' members are job ids (the rescue), not lease members.
        """
        run_id = text(result[0])
        self._last_run_id, self._last_uptime = run_id, int(result[1])
        role, age, online, expected, first = (text(x) for x in result[3:8])
        self._last_primary = PrimaryState(
            role=role,
            age=float(age),
            replicas_online=int(online),
            replicas_expected=int(expected),
            first_seen=float(first),
        )
        verdicts = []
        for raw in result[12 : 12 + int(result[11])]:
            verdict, stalled, max_stalled, length, rest = raw.split(b' ', 4)
            size = int(length)
            member = rest[:size].decode('utf-8', 'replace')
            if bare_ids:
                job_id = member
            else:
                job_id, colon, execution_id = member.partition(':')
                if not (colon and job_id and execution_id and ':' not in execution_id):
                    job_id = ''
            verdicts.append(
                LeaseVerdict(
                    queue=name,
                    member=member,
                    job_id=job_id,
                    verdict=Verdict(verdict.decode()),
                    stalled=int(stalled),
                    max_stalled=int(max_stalled),
                    lease_epoch=rest[size:].decode('utf-8', 'replace'),
                    run_id=run_id,
                )
            )
        return verdicts

    def log_verdict(self, verdict: LeaseVerdict) -> None:
        """Log one line per verdict on the ``rq_epoch`` logger.

        The record is made directly (no search of the stack for the caller, which would
        cost more than the rest of the record): a sweep may log tens of thousands.
        """
        level = verdict.verdict.level
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(
            logger.name,
            level,
            __file__,
            _LOG_VERDICT_LINE,
            'sweep: job %s queue %s verdict %s stalled %d/%d lease_epoch %s run_id %s',
            (
                verdict.job_id or '-',
                verdict.queue,
                verdict.verdict,
                verdict.stalled,
                verdict.max_stalled,
                verdict.lease_epoch or '(none)',
                verdict.run_id,
            ),
            None,
            func='log_verdict',
        )
        logger.handle(record)

    def before_finish(self, verdicts: list[LeaseVerdict]) -> None:
        """Called after a sweep call gave dead verdicts, before their side effects run."""

    # -- dead letters ----------------------------------------------------------------

    def finish_dead_letters(self, report: SweepReport | None = None, limit: int = 1000) -> list[str]:
        """Run the side effects of dead letters nobody has finished (claimed, bounded)."""
        done: list[str] = []
        while len(done) < limit:
            claimed = scripts.claim()(
                self.connection, [keys.finishing_key()], [min(100, limit - len(done)), self.claim_ttl]
            )
            if not claimed:
                break
            done.extend(self.finish_many([text(raw) for raw in claimed]))
        if report is not None:
            report.finished.extend(done)
        return done

    def failure_reason(self, job: Job, max_stalled: int, epochs: Any = None) -> str:
        """The text of a dead letter's failure, as ``exc_info`` and in its failure Result.

        ``epochs`` is the job's ``stall_epochs`` field when the caller has read it already.
        """
        if epochs is None:
            epochs = self.connection.hget(job.key, 'stall_epochs')
        epoch_list = text(epochs).split(',') if epochs else [job.lease_epoch or '']
        unique = ', '.join(dict.fromkeys(e for e in epoch_list if e)) or '(none)'
        return (
            f'{StalledJobError.__name__}: job stalled {job.stalled} time(s) (max_stalled {max_stalled}): '
            f'its workers went away while the server stayed up; '
            f'counted under server epoch(s) {unique}; dead-lettered by rq-epoch at {now().isoformat()}'
        )

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        """Log a dead letter whose side effects have run (one line on the ``rq_epoch`` logger)."""
        logger.error('sweep: job %s dead-lettered to FailedJobRegistry of %s: %s', job.id, queue_name, reason)

    def finish_many(self, members: list[str]) -> list[str]:
        """Side effects of claimed dead letters, a batch at a time; returns the job ids finished.

        Two round trips read every job, its stall epochs and whether it has dependents;
        callbacks and handlers run per job, dependents only for jobs that have some; one
        transaction then writes every failure Result and removes the finishing entries,
        so each Result exists exactly once. If another sweeper touches the finishing set
        meanwhile, the batch falls back to one transaction per job.
        """
        finishing = keys.finishing_key()
        ids = [m.split('|', 1)[1] for m in members]
        jobs = self.job_class.fetch_many(ids, connection=self.connection, serializer=self.serializer)
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(keys.job_key(job_id), 'stall_epochs')
                pipe.exists(keys.job_dependents_key(job_id))
            extra = pipe.execute()
        ready: list[tuple[str, Job, str]] = []
        moot = []
        for i, (member, job) in enumerate(zip(members, jobs, strict=True)):
            if job is None or job.get_status(refresh=False) != JobStatus.FAILED:
                moot.append(member)  # gone, or requeued by hand before we finished
                continue
            job = cast(Job, job)
            reason = self.failure_reason(job, job.max_stalled or self.settings.max_stalled, extra[2 * i] or '')
            self._side_effects(job, member.split('|', 1)[0], reason, bool(extra[2 * i + 1]))
            ready.append((member, job, reason))
        if moot:
            self.connection.zrem(finishing, *moot)
        recorded = self._record_failures(ready)
        for member, job, reason in ready:
            if member in recorded:
                self._after_failure(job, reason)
        return [job.id for member, job, _ in ready if member in recorded]

    def _side_effects(self, job: Job, queue_name: str, reason: str, has_dependents: bool) -> None:
        error = StalledJobError(reason)
        self._run_failure_callback(job, error)
        for handler in self.exception_handlers:
            try:
                if handler(job, StalledJobError, error, None) is False:
                    break
            except Exception:
                logger.exception('sweep: exception handler for job %s raised', job.id)
        if has_dependents:
            queue = self.queue_class(
                queue_name, connection=self.connection, serializer=self.serializer, job_class=self.job_class
            )
            try:
                queue.enqueue_dependents(job)
            except Exception:
                logger.exception('sweep: could not enqueue dependents of job %s', job.id)

    def _record_failures(self, ready: list[tuple[str, Job, str]]) -> set[str]:
        """One transaction for the batch; job by job if the finishing set changed meanwhile."""
        if not ready:
            return set()
        finishing = keys.finishing_key()
        members = [member for member, _, _ in ready]
        with self.connection.pipeline() as pipeline:
            try:
                pipeline.watch(finishing)
                scores = pipeline.zmscore(finishing, members)
                pipeline.multi()
                kept = set()
                for (member, job, reason), score in zip(ready, scores, strict=True):
                    if score is None:
                        continue
                    kept.add(member)
                    self._queue_failure(pipeline, job, member, reason)
                pipeline.execute()
            except WatchError:
                kept = {member for member, job, reason in ready if self._record_failure(job, member, reason)}
        for member, job, reason in ready:
            if member in kept:
                self.log_dead_letter(job, member.split('|', 1)[0], reason)
        return kept

    def _run_failure_callback(self, job: Job, error: StalledJobError) -> None:
        try:
            compat.execute_failure_callback(job, self.death_penalty_class, StalledJobError, error, None)
        except Exception:
            logger.exception('sweep: on_failure callback of job %s raised', job.id)

    @staticmethod
    def _queue_failure(pipeline: Any, job: Job, member: str, reason: str) -> None:
        """Queue RQ's failure bookkeeping (status, registry, Result) and drop the finishing entry."""
        job.ended_at = now()
        compat.record_job_failure(job, reason, pipeline)
        pipeline.hset(job.key, 'ended_at', job.ended_at.strftime('%Y-%m-%dT%H:%M:%S.%fZ'))
        pipeline.zrem(keys.finishing_key(), member)

    def _record_failure(self, job: Job, member: str, reason: str) -> bool:
        finishing = keys.finishing_key()
        for _ in range(10):
            with self.connection.pipeline() as pipeline:
                try:
                    pipeline.watch(finishing)
                    if pipeline.zscore(finishing, member) is None:
                        return False
                    pipeline.multi()
                    self._queue_failure(pipeline, job, member, reason)
                    pipeline.execute()
                    return True
                except WatchError:
                    continue
        return False

    def _after_failure(self, job: Job, reason: str) -> None:
        try:
            compat.release_rate_limit_slot(job)
        except Exception:
            logger.exception('sweep: could not release the rate-limit slot of job %s', job.id)
        send = getattr(job, 'send_webhooks', None)
        if send is not None:
            try:
                send(JobStatus.FAILED, exc_string=reason)
            except Exception:
                logger.exception('sweep: failed webhooks of job %s raised', job.id)


_LOG_VERDICT_LINE = Sweeper.log_verdict.__code__.co_firstlineno
