"""The epoch-aware sweep: verdicts for expired leases, and the finishing of dead letters."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import ResponseError
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.job import Job as RQJob
from rq.serializers import resolve_serializer
from rq.timeouts import BaseDeathPenalty, UnixSignalDeathPenalty

from ..jobs.job import Job
from ..jobs.jobclass import resolve_job_class
from ..jobs.queue import Queue
from ..protocol import keys, verbs
from ..protocol.report import LeaseVerdict, SweepReport
from ..protocol.server import read_epoch
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings
from .deadletters import CLAIM_TTL, DeadLetters

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['Sweeper']

logger = logging.getLogger('rq_epoch')

#: The line :meth:`Sweeper.log_verdict` logs for each verdict.
_LOG_VERDICT_MSG = 'sweep: job %s queue %s verdict %s stalled %d/%d lease_epoch %s run_id %s'
#: Override points of the dead letters that were the sweeper's before 0.3 (see ``Sweeper.__init_subclass__``).
_MOVED_HOOKS = ('failure_reason', 'log_dead_letter')


class Sweeper:
    """Runs the epoch-aware sweep over queues and finishes the jobs it dead-letters.

    Safe to run from any number of processes at once: each expired lease is judged by
    exactly one sweep script call, and each dead letter's side effects are claimed.

    The jobs a sweep dead-letters are finished by :attr:`dead_letters`, a
    :class:`~rq_epoch.sweep.deadletters.DeadLetters` made in ``__init__`` from
    :attr:`dead_letters_class` with the sweeper's connection, job and queue classes,
    serializer, stall budget, claim TTL, death penalty and exception handlers.

    Subclassing points: :meth:`log_verdict`, :meth:`before_finish` (called after a script
    returned, before the side effects of its dead letters run; the tests use it to kill a
    sweeper there), and the classes it uses: :attr:`job_class`, :attr:`queue_class`,
    :attr:`death_penalty_class` and :attr:`dead_letters_class` (whose
    :meth:`~rq_epoch.sweep.deadletters.DeadLetters.failure_reason` and
    :meth:`~rq_epoch.sweep.deadletters.DeadLetters.log_dead_letter` say what a dead letter's
    failure reads and how it is logged).

    ``job_class`` (the argument, else the class attribute) may be any class derived from
    RQ's Job; the sweep uses its epoch variant, and refuses any other class as the worker
    does (see :func:`rq_epoch.jobs.jobclass.resolve_job_class`).
    """

    job_class: type[Job] = Job
    #: The class of the queues a dead letter's dependents are enqueued with.
    queue_class: type[Queue] = Queue
    #: What bounds a dead letter's ``on_failure`` callback (the argument overrides it).
    death_penalty_class: type[BaseDeathPenalty] = UnixSignalDeathPenalty
    #: What finishes the jobs a sweep dead-letters (one per sweeper, :attr:`dead_letters`).
    dead_letters_class: type[DeadLetters] = DeadLetters
    #: Seconds to wait for a replica to acknowledge counted verdicts (``WAIT``).
    confirm_timeout: float = 1.0

    def __init__(
        self,
        connection: Redis,
        *,
        job_class: type[RQJob] | str | None = None,
        serializer: Any = None,
        settings: EpochSettings | None = None,
        max_stalled: int | None = None,
        batch_size: int | None = None,
        restart_grace: int | None = None,
        failure_ttl: int = DEFAULT_FAILURE_TTL,
        claim_ttl: int = CLAIM_TTL,
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
        self._server_checked = False
        self.job_class = resolve_job_class(type(self), job_class)
        self.serializer = resolve_serializer(serializer)
        self.failure_ttl = failure_ttl
        #: Requeue jobs stranded in RQ's intermediate queue after one lease length.
        self.rescue_intermediate = rescue_intermediate
        #: Finishes the jobs this sweeper dead-letters (see :class:`~rq_epoch.sweep.deadletters.DeadLetters`).
        self.dead_letters = self.dead_letters_class(
            connection,
            max_stalled=self.settings.max_stalled,
            job_class=self.job_class,
            queue_class=self.queue_class,
            serializer=self.serializer,
            claim_ttl=claim_ttl,
            death_penalty_class=death_penalty_class or self.death_penalty_class,
            exception_handlers=exception_handlers or (),
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Warn about a subclass that overrides ``failure_reason`` or ``log_dead_letter``: before
        0.3 the sweep called the sweeper's; it calls those of its :attr:`dead_letters` now."""
        super().__init_subclass__(**kwargs)
        for name in _MOVED_HOOKS:
            if getattr(cls, name) is not getattr(Sweeper, name):
                warnings.warn(
                    f'{cls.__qualname__}.{name} is not called by the sweep: override {name} on a subclass '
                    f'of rq_epoch.DeadLetters and name it in {cls.__qualname__}.dead_letters_class',
                    stacklevel=2,
                )

    # -- dead letters (the work of :attr:`dead_letters`) ------------------------------

    def finish_dead_letters(self, report: SweepReport | None = None, limit: int = 1000) -> list[str]:
        """Run the side effects of dead letters nobody has finished (claimed, bounded); returns the job ids finished.

        What :meth:`sweep` does after its verdicts; any sweeper's dead letters, including those
        a sweeper that died left: :meth:`DeadLetters.finish <rq_epoch.sweep.deadletters.DeadLetters.finish>`.
        """
        return self.dead_letters.finish(report, limit)

    def failure_reason(self, job: Job, max_stalled: int, epochs: Any = None, at: str | None = None) -> str:
        """The text of a dead letter's failure: that of :attr:`dead_letters` (override it there)."""
        return self.dead_letters.failure_reason(job, max_stalled, epochs, at)

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        """Log a dead letter as :attr:`dead_letters` does (override it there)."""
        self.dead_letters.log_dead_letter(job, queue_name, reason)

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
            UnsupportedServerError: the server is older than rq-epoch needs (nothing is written).
        """
        names = list(queue_names)
        report = SweepReport(dry_run=dry_run)
        if not names or not self._server_checked:
            # The server's version, once per sweeper before its first script call, and the
            # epoch when no script call will read it.
            current = read_epoch(self.connection, with_role=False)
            self._server_checked = True
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
        lease_offset = stock_offset = legacy_offset = 0
        # Every call either removes what it judged or moves an offset forward, so this
        # ends; the bound only guards against a server that keeps answering "more".
        for _ in range(1_000_000):
            reply = self._call(name, dry_run, lease_offset, stock_offset, legacy_offset, client)
            self._take_verdicts(reply, report, dry_run, progress, client)
            left = reply.left_leases + reply.left_stock + reply.left_legacy
            if not reply.more or (left == 0 and not reply.verdicts):
                break
            lease_offset += reply.left_leases
            stock_offset += reply.left_stock
            legacy_offset += reply.left_legacy
        if self.rescue_intermediate:
            self._take_verdicts(self._rescue(name, dry_run, client), report, dry_run, progress, client)

    def _take_verdicts(
        self,
        reply: verbs.SweepReply,
        report: SweepReport,
        dry_run: bool,
        progress: Callable[[int], None] | None,
        client: Redis | None,
    ) -> None:
        """Add one script call's verdicts to the report, log them, and confirm counted ones."""
        verdicts = list(reply.verdicts)
        if not dry_run and not self._confirmed(client or self.connection, reply):
            report.unconfirmed += 1
        report.run_id, report.uptime = reply.run_id, reply.uptime
        report.primary = reply.primary
        report.verdicts.extend(verdicts)
        if progress is not None and verdicts:
            progress(len(verdicts))
        if not dry_run:
            for verdict in verdicts:
                self.log_verdict(verdict)
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

    def _confirmed(self, client: Redis, reply: verbs.SweepReply) -> bool:
        """Whether a replica has the counted verdicts of a call, when the primary has replicas.

        A counted verdict (recovered, dead) written on a primary that was just demoted, or
        cut off from its replicas, vanishes when it resyncs; its side effects must not run.
        ``WAIT 1`` on the connection that ran the script tells: some replica acknowledged
        the writes within :attr:`confirm_timeout`. Without replicas there is nothing to wait for.
        """
        primary = reply.primary
        if primary.replicas_expected == 0 and primary.replicas_online == 0:
            return True
        if not any(v.counted for v in reply.verdicts):
            return True
        try:
            acked = int(client.execute_command('WAIT', 1, int(self.confirm_timeout * 1000)))
        except ResponseError as exc:  # WAIT refused (an ACL): say so, and trust the script's own check
            logger.warning('sweep: WAIT refused (%s); counted verdicts are not confirmed by a replica', exc)
            return True
        return acked >= 1

    def _call(
        self,
        name: str,
        dry_run: bool,
        lease_offset: int,
        stock_offset: int,
        legacy_offset: int = 0,
        client: Redis | None = None,
    ) -> verbs.SweepReply:
        """One call of the sweep script."""
        return verbs.sweep(
            client if client is not None else self.connection,
            name,
            _verb_keys(name, keys.finishing_key()),
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
                legacy_offset,
            ],
        )

    def _rescue(self, name: str, dry_run: bool, client: Redis | None = None) -> verbs.SweepReply:
        """One call of the rescue script: jobs stranded in RQ's intermediate list for a lease length."""
        return verbs.rescue(
            client if client is not None else self.connection,
            name,
            _verb_keys(name, keys.limbo_key(name)),
            [
                keys.PREFIX,
                name,
                self.settings.batch_size,
                self.settings.max_stalled,
                self.settings.lease_ttl,
                '1' if dry_run else '0',
            ],
        )

    def log_verdict(self, verdict: LeaseVerdict) -> None:
        """Log one line per verdict on the ``rq_epoch`` logger, at the verdict's level."""
        logger.log(
            verdict.verdict.level,
            _LOG_VERDICT_MSG,
            verdict.job_id or '-',
            verdict.queue,
            verdict.verdict,
            verdict.stalled,
            verdict.max_stalled,
            verdict.lease_epoch or '(none)',
            verdict.run_id,
        )

    def before_finish(self, verdicts: list[LeaseVerdict]) -> None:
        """Called after a sweep call gave dead verdicts, before their side effects run."""


def _verb_keys(name: str, third: str) -> list[str]:
    """KEYS of the sweep and rescue scripts for queue ``name``: they differ only in the third
    (the finishing set for the sweep, the limbo record for the rescue)."""
    return [keys.leases_key(name), keys.wip_key(name), third, keys.stats_key(name), keys.legacy_leases_key(name)]
