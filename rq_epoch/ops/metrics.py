"""Prometheus metrics of rq-epoch: a collector an application can register, and the exporter's server.

:class:`EpochCollector` reads what rq-epoch adds to RQ's data (leases, verdict counters,
dead letters, the server epoch) and turns it into metric families for ``prometheus-client``
(``pip install 'rq-epoch[prometheus]'``). This module imports without ``prometheus-client``;
only :meth:`EpochCollector.collect`, :meth:`EpochCollector.describe` and :func:`serve` need it.

One scrape costs a fixed number of round trips, whatever the number of queues and jobs
(:data:`ROUND_TRIPS`), and never scans the keyspace: the queues are the members of RQ's
``<prefix>:queues`` set (or the ones given), and each queue's lists and registries are read
up to ``scan_limit`` entries.

=========  =================================================================================
round trip what it reads
=========  =================================================================================
1          :func:`rq_epoch.protocol.server.read_epoch`: ``INFO server`` (the run_id)
2          pipelined: ``TIME``, ``INFO replication``, the primaries record
           (``<prefix>:epoch:primaries``, for the age of the epoch), the record of life
           (``<prefix>:epoch:alive``, for leases of an earlier process that ran out while it
           served) and the members of ``<prefix>:queues``
3          per queue, pipelined: the counters hash, the leases, RQ's started registry, the
           head of the queue, the newest entries of the failed registry
4          pipelined ``HMGET`` of every job seen in 3 (left out when there is none)
=========  =================================================================================
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import redis.exceptions

from ..compat import optional_text, text
from ..errors import RqEpochError
from ..jobs.job import stalled_count
from ..protocol import epoch, keys
from ..protocol.server import PrimaryState, ServerEpoch, primary_state, read_epoch
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import Metric
    from prometheus_client.registry import CollectorRegistry
    from redis import Redis
    from redis.client import Pipeline

__all__ = [
    'DEFAULT_PORT',
    'DEFAULT_SCAN_LIMIT',
    'LEASE_STATES',
    'ROUND_TRIPS',
    'SWEPT_VERDICTS',
    'EpochCollector',
    'MetricsSnapshot',
    'QueueMetrics',
    'epoch_age',
    'read_snapshot',
    'metrics_app',
    'serve',
]

logger = logging.getLogger('rq_epoch')

#: Port of ``rq-epoch exporter`` when none is given.
DEFAULT_PORT = 9727
#: Entries read per queue from each list or registry in one scrape.
DEFAULT_SCAN_LIMIT = 1000
#: Round trips of one scrape (fewer when there are no queues or no jobs to read).
ROUND_TRIPS = 4
#: Verdicts the sweep counts in ``<prefix>:epoch:stats:<queue>`` (deferred leases are not counted).
SWEPT_VERDICTS = tuple(v.value for v in Verdict if v.judged)
#: States of ``rq_epoch_leases``.
LEASE_STATES = ('live', 'expired-counted', 'expired-uncounted', 'deferred', 'expired-stale')

_INSTALL_HINT = "the Prometheus metrics need prometheus-client: pip install 'rq-epoch[prometheus]'"
#: A lease member: the job id, or ``<job_id>:<execution_id>`` in a 0.2.0 worker's lease.
_MEMBER_RE = re.compile(r'([^:]+)(?::([^:]+))?')


def epoch_age(state: PrimaryState) -> int:
    """Seconds the current epoch has lasted, as the restart grace counts them.

    That is how long this server process has been serving the dataset as primary (since its
    restart or its promotion), as the sweep script records it in ``<prefix>:epoch:primaries``;
    0 on a replica, or before any sweep recorded this primary. Every metric that depends on the
    age of the epoch goes through here.
    """
    return int(state.age) if state.is_primary else 0


def _number(raw: Any) -> float:
    try:
        return float(optional_text(raw) or 0)
    except ValueError:
        return 0.0


@dataclass
class QueueMetrics:
    """What one scrape saw of one queue."""

    name: str
    #: The sweep's counters (``<prefix>:epoch:stats:<queue>``), every swept verdict listed.
    verdicts: dict[str, int] = field(default_factory=dict)
    #: Server time of the last sweep of this queue; 0 when no sweep has recorded one.
    last_sweep: float = 0.0
    #: Outcomes of stale executions refused by the fence (0 until fencing records some).
    refused: int = 0
    #: Jobs handed back to the front of the queue by workers told to stop (deploys).
    handed_back: int = 0
    #: Managed leases per state (:data:`LEASE_STATES`).
    leases: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEASE_STATES, 0))
    #: Entries of RQ's started registry held by stock RQ workers (a finite score).
    stock_leases: int = 0
    #: Jobs in the failed registry that the sweep dead-lettered (still failed).
    dead_letters: int = 0
    #: Jobs waiting or running with at least one counted stall.
    stalled_jobs: int = 0
    #: True when a list or registry had more entries than were read: the numbers read
    #: from entries (expired lease states, dead letters, stalled jobs) are lower bounds.
    truncated: bool = False


@dataclass
class MetricsSnapshot:
    """One scrape's reading of the server: its epoch and every queue."""

    server: ServerEpoch
    #: Seconds the epoch has lasted (:func:`epoch_age`).
    age: int
    #: The restart grace the leases were judged with.
    grace: int
    now: float
    queues: list[QueueMetrics] = field(default_factory=list)

    @property
    def grace_remaining(self) -> int:
        """Seconds until leases of an older epoch may be swept (0 once the grace is over)."""
        return max(0, self.grace - self.age)


def read_snapshot(
    connection: Redis,
    *,
    queues: Sequence[str] | None = None,
    restart_grace: int | None = None,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> MetricsSnapshot:
    """Read the state the metrics show, in at most :data:`ROUND_TRIPS` round trips. Writes nothing.

    ``queues``: the queues to read; None (or empty) means every queue in ``<prefix>:queues``.
    ``restart_grace``: None takes the settings (``RQ_EPOCH_RESTART_GRACE``, else heartbeat
    plus lease margin), as the sweep does.

    Raises:
        EpochUnavailableError: the server yields no valid run_id.
        redis.exceptions.RedisError: the server could not be read.
    """
    grace = EpochSettings.resolve(restart_grace=restart_grace).grace
    limit = max(1, int(scan_limit))
    current = read_epoch(connection, with_role=False)
    with connection.pipeline(transaction=False) as pipeline:
        pipeline.time()
        pipeline.info('replication')
        pipeline.hgetall(keys.primaries_key())
        pipeline.hgetall(keys.alive_key())
        if not queues:
            pipeline.smembers(keys.queues_key())
        # ``registered``: [the members of <prefix>:queues] when no queues were given, else [].
        (seconds, micros), replication, primaries, alive, *registered = pipeline.execute()
    now = float(seconds) + float(micros) / 1e6
    state = primary_state(current, replication, primaries, now)
    current = replace(current, role=state.role)
    age = epoch_age(state)
    seen_alive = {text(k): epoch.parse_seen_alive(v) for k, v in alive.items()}
    names = list(dict.fromkeys(queues)) if queues else keys.queue_names(registered[0])
    snapshot = MetricsSnapshot(server=current, age=age, grace=grace, now=now)
    if not names:
        return snapshot

    with connection.pipeline(transaction=False) as pipeline:
        for name in names:
            _QueueReplies.queue(pipeline, name, now, limit)
        readings = _QueueReplies.read_all(pipeline.execute(), len(names))

    job_ids: dict[str, None] = {}
    seen: list[tuple[QueueMetrics, list[tuple[re.Match[str] | None, float]], list[str], list[str]]] = []
    for name, reading in zip(names, readings, strict=True):
        # Leases of 0.2.0 workers (during an upgrade) count like the others.
        n_leases = int(reading.leases) + int(reading.legacy_leases)
        n_expired = int(reading.expired_leases) + int(reading.expired_legacy_leases)
        lease_rows = reading.lease_rows + reading.legacy_lease_rows
        q = QueueMetrics(name=name)
        counters = {optional_text(k) or '': v for k, v in reading.counters.items()}
        q.verdicts = {verdict: int(_number(counters.get(verdict))) for verdict in SWEPT_VERDICTS}
        q.last_sweep = _number(counters.get('last_sweep'))
        q.refused = int(_number(counters.get('refused')))
        q.handed_back = int(_number(counters.get('handed_back')))
        q.leases['live'] = n_leases - n_expired
        q.stock_leases = int(reading.stock_leases)
        q.truncated = n_leases > limit or int(reading.queued) > limit or int(reading.failed) > limit
        lease_entries = [(_MEMBER_RE.fullmatch(text(member)), float(score)) for member, score in lease_rows]
        queued_ids = [text(x) for x in reading.queued_ids]
        failed_ids = [text(x) for x in reading.failed_ids]
        for match, _ in lease_entries:
            if match:
                job_ids[match.group(1)] = None
        for job_id in (*queued_ids, *failed_ids):
            job_ids[job_id] = None
        seen.append((q, lease_entries, queued_ids, failed_ids))

    jobs: dict[str, _JobFields] = {}
    if job_ids:
        ids = list(job_ids)
        with connection.pipeline(transaction=False) as pipeline:
            for job_id in ids:
                _JobFields.queue(pipeline, job_id)
            rows = pipeline.execute(raise_on_error=False)
        for job_id, row in zip(ids, rows, strict=True):
            job = _JobFields.read(row)
            if job is not None:
                jobs[job_id] = job

    for q, lease_entries, queued_ids, failed_ids in seen:
        stalled: set[str] = set()
        for match, deadline in lease_entries:
            row = jobs.get(match.group(1)) if match else None
            if deadline <= now:
                q.leases[_lease_state(match, row, current.run_id, age, grace, deadline, seen_alive)] += 1
            if match and row is not None and _waiting_with_stalls(row):
                stalled.add(match.group(1))
        for job_id in queued_ids:
            row = jobs.get(job_id)
            if row is not None and _waiting_with_stalls(row):
                stalled.add(job_id)
        q.stalled_jobs = len(stalled)
        for job_id in failed_ids:
            row = jobs.get(job_id)
            if row is not None and row.status == 'failed' and row.stall_dead is not None:
                q.dead_letters += 1
        snapshot.queues.append(q)
    return snapshot


@dataclass(frozen=True)
class _QueueReplies:
    """The replies of one queue in the scrape's third round trip, in the order :meth:`queue` sends
    their commands (a field per command)."""

    #: HGETALL of the counters hash.
    counters: dict[Any, Any]
    #: The leases: how many, how many expired, and the first ``limit`` with their deadlines.
    leases: int
    expired_leases: int
    lease_rows: list[tuple[Any, float]]
    #: The same of the leases of 0.2.0 workers.
    legacy_leases: int
    expired_legacy_leases: int
    legacy_lease_rows: list[tuple[Any, float]]
    #: Entries of RQ's started registry with a finite score (stock workers').
    stock_leases: int
    #: Length of the queue and its first ``limit`` job ids.
    queued: int
    queued_ids: list[Any]
    #: Size of the failed registry and its newest ``limit`` job ids.
    failed: int
    failed_ids: list[Any]

    @staticmethod
    def queue(pipeline: Pipeline, name: str, now: float, limit: int) -> None:
        """Queue the commands whose replies make one :class:`_QueueReplies`, in the order of its fields."""
        pipeline.hgetall(keys.stats_key(name))
        for leases in (keys.leases_key(name), keys.legacy_leases_key(name)):
            pipeline.zcard(leases)
            pipeline.zcount(leases, '-inf', now)
            pipeline.zrange(leases, 0, limit - 1, withscores=True)
        pipeline.zcount(keys.wip_key(name), '-inf', '(+inf')
        pipeline.llen(keys.queue_key(name))
        pipeline.lrange(keys.queue_key(name), 0, limit - 1)
        pipeline.zcard(keys.failed_key(name))
        pipeline.zrevrange(keys.failed_key(name), 0, limit - 1)

    @classmethod
    def read_all(cls, replies: list[Any], queues: int) -> list[_QueueReplies]:
        """The replies of :meth:`queue` called for ``queues`` queues, one value per queue."""
        size = len(fields(cls))
        if len(replies) != size * queues:
            raise RqEpochError(f'metrics: expected {size * queues} replies for {queues} queue(s), got {len(replies)}')
        return [cls(*replies[start : start + size]) for start in range(0, len(replies), size)]


@dataclass(frozen=True)
class _JobFields:
    """The fields of a job hash the metrics read (``HMGET``, text; None where a field is missing)."""

    status: str | None
    lease_epoch: str | None
    lease_execution: str | None
    stalled: str | None
    stall_dead: str | None
    stop_mark: str | None

    @classmethod
    def queue(cls, pipeline: Pipeline, job_id: str) -> None:
        """Queue the ``HMGET`` of the fields, in the order of the dataclass's."""
        pipeline.hmget(keys.job_key(job_id), *(f.name for f in fields(cls)))

    @classmethod
    def read(cls, row: Any) -> _JobFields | None:
        """The fields from the ``HMGET``'s reply; None for a job that is gone or not a hash."""
        if isinstance(row, Exception):  # not a hash
            return None
        job = cls(*(optional_text(value) for value in row))
        return None if job.status is None else job


def _waiting_with_stalls(row: _JobFields) -> bool:
    return row.status in ('queued', 'started') and stalled_count(row.stalled, row.status, row.stall_dead) > 0


def _lease_state(
    match: re.Match[str] | None,
    row: _JobFields | None,
    run_id: str,
    age: int,
    grace: int,
    deadline: float | None = None,
    seen_alive: dict[str, epoch.SeenAlive | None] | None = None,
) -> str:
    """The verdict the next sweep would give an expired lease, as a state of ``rq_epoch_leases``.

    The same rule as the sweep script: a lease of a job that is gone, ended or started again
    under another execution is stale (the sweep only drops the entry); a lease stamped by the
    current server process, or by one whose record of life (``seen_alive``, by run_id) shows it
    serving after the lease's ``deadline``, is counted; any other lease is uncounted, and
    deferred while the epoch is younger than the restart grace.
    """
    if match is None or row is None:
        return 'expired-stale'
    status, lease_epoch, lease_execution = row.status, row.lease_epoch, row.lease_execution
    # A job's lease is held by its lease_execution; a 0.2.0 lease names its execution.
    execution = match.group(2) or lease_execution
    if execution is None:
        return 'expired-stale'
    never_started = False
    if status == 'started':
        if lease_execution and lease_execution != execution:
            return 'expired-stale'
    elif status == 'queued' and lease_execution == execution:
        never_started = True  # granted, then its worker died before starting it: never counted
    else:
        return 'expired-stale'
    if epoch.within_stop_window(execution, deadline, epoch.parse_stop_mark(row.stop_mark)):
        # Its worker was told to stop and was killed first (verdict stopping): never counted.
        return 'deferred' if age < grace and lease_epoch != run_id else 'expired-uncounted'
    seen = (seen_alive or {}).get(lease_epoch or '')
    if not never_started and epoch.is_counted(lease_epoch, run_id, deadline=deadline, seen_alive=seen):
        return 'expired-counted'
    return 'deferred' if age < grace else 'expired-uncounted'


def _prometheus() -> Any:
    try:
        from prometheus_client import core
    except ImportError as exc:
        raise RqEpochError(_INSTALL_HINT) from exc
    return core


class EpochCollector:
    """A ``prometheus-client`` collector of rq-epoch's metrics.

    Register it in any registry::

        from prometheus_client import CollectorRegistry
        from rq_epoch.ops.metrics import EpochCollector

        registry = CollectorRegistry()
        registry.register(EpochCollector(redis_connection))

    Each collection reads the server once (:func:`read_snapshot`). When the server cannot be
    read, the collection has ``rq_epoch_up 0`` and nothing else, and the reason is logged
    on the ``rq_epoch`` logger (once per kind of error, until a read succeeds again).
    """

    def __init__(
        self,
        connection: Redis,
        *,
        queues: Sequence[str] | None = None,
        restart_grace: int | None = None,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
    ) -> None:
        EpochSettings.resolve(restart_grace=restart_grace)  # a bad setting fails here, not at a scrape
        self.connection = connection
        self.queues = list(queues or [])
        self.restart_grace = restart_grace
        self.scan_limit = scan_limit
        self._last_error = ''

    def snapshot(self) -> MetricsSnapshot:
        """Read the server now (see :func:`read_snapshot`)."""
        return read_snapshot(
            self.connection, queues=self.queues, restart_grace=self.restart_grace, scan_limit=self.scan_limit
        )

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (so registering does not read the server)."""
        yield from self._families(None)

    def collect(self) -> Iterator[Metric]:
        """Read the server and yield every metric family."""
        try:
            snapshot = self.snapshot()
        except (redis.exceptions.RedisError, RqEpochError) as exc:
            if type(exc).__name__ != self._last_error:
                logger.warning('metrics: cannot read the server: %s: %s', type(exc).__name__, exc)
                self._last_error = type(exc).__name__
            core = _prometheus()
            yield core.GaugeMetricFamily('rq_epoch_up', _HELP['up'], value=0)
            return
        self._last_error = ''
        yield from self._families(snapshot)

    def _families(self, snap: MetricsSnapshot | None) -> Iterator[Metric]:
        core = _prometheus()
        gauge, counter = core.GaugeMetricFamily, core.CounterMetricFamily
        up = gauge('rq_epoch_up', _HELP['up'])
        info = gauge('rq_epoch_server_info', _HELP['server_info'], labels=['run_id', 'role'])
        age = gauge('rq_epoch_epoch_age_seconds', _HELP['age'])
        grace = gauge('rq_epoch_restart_grace_remaining_seconds', _HELP['grace_remaining'])
        verdicts = counter('rq_epoch_sweep_verdicts', _HELP['verdicts'], labels=['queue', 'verdict'])
        refused = counter('rq_epoch_stale_outcomes_refused', _HELP['refused'], labels=['queue'])
        handed_back = counter('rq_epoch_handed_back', _HELP['handed_back'], labels=['queue'])
        last_sweep = gauge('rq_epoch_last_sweep_timestamp_seconds', _HELP['last_sweep'], labels=['queue'])
        leases = gauge('rq_epoch_leases', _HELP['leases'], labels=['queue', 'state'])
        stock = gauge('rq_epoch_stock_leases', _HELP['stock'], labels=['queue'])
        dead = gauge('rq_epoch_dead_letters', _HELP['dead'], labels=['queue'])
        stalled = gauge('rq_epoch_stalled_jobs', _HELP['stalled'], labels=['queue'])
        truncated = gauge('rq_epoch_scrape_truncated', _HELP['truncated'], labels=['queue'])
        if snap is not None:
            up.add_metric([], 1)
            info.add_metric([snap.server.run_id, snap.server.role or 'unknown'], 1)
            age.add_metric([], snap.age)
            grace.add_metric([], snap.grace_remaining)
            for q in snap.queues:
                for verdict in SWEPT_VERDICTS:
                    verdicts.add_metric([q.name, verdict], q.verdicts.get(verdict, 0))
                refused.add_metric([q.name], q.refused)
                handed_back.add_metric([q.name], q.handed_back)
                last_sweep.add_metric([q.name], q.last_sweep)
                for state in LEASE_STATES:
                    leases.add_metric([q.name, state], q.leases[state])
                stock.add_metric([q.name], q.stock_leases)
                dead.add_metric([q.name], q.dead_letters)
                stalled.add_metric([q.name], q.stalled_jobs)
                truncated.add_metric([q.name], 1 if q.truncated else 0)
        yield from (
            up,
            info,
            age,
            grace,
            verdicts,
            refused,
            handed_back,
            last_sweep,
            leases,
            stock,
            dead,
            stalled,
            truncated,
        )


_HELP = {
    'up': '1 when this scrape read the server, 0 when it could not (the reason is logged).',
    'server_info': 'The server process whose run_id stamps new leases (the current epoch), and its role.',
    'age': 'Seconds this server process has served the dataset as primary (since its restart or promotion).',
    'grace_remaining': 'Seconds until leases of an older epoch may be swept; 0 once the restart grace is over.',
    'verdicts': 'Expired leases the sweep judged, per verdict (kept in the server: they survive restarts).',
    'refused': 'Outcomes of stale executions refused by the lease fence.',
    'handed_back': 'Running jobs handed back to the front of their queue, uncounted, by workers told to stop.',
    'last_sweep': 'Server time of the last sweep of the queue, in seconds since the Unix epoch; 0 if none recorded.',
    'leases': 'Leases of running jobs managed by rq-epoch, per state: live, or expired and what the next sweep '
    'will do with them (counted stall, uncounted requeue, deferred for the restart grace, stale entry).',
    'stock': "Jobs held by stock RQ workers (entries with a deadline in RQ's started registry).",
    'dead': 'Jobs the sweep dead-lettered that are still in the failed registry.',
    'stalled': 'Jobs waiting or running that have at least one counted stall.',
    'truncated': '1 when a list or registry had more entries than the scan limit: per-entry counts are lower bounds.',
}


def serve(collector: EpochCollector, host: str = '127.0.0.1', port: int = DEFAULT_PORT) -> tuple[WSGIServer, Any]:
    """Serve ``collector`` (and nothing else) at ``http://host:port/metrics`` in a daemon thread.

    Returns the server and its thread (``server.server_port`` is the port bound, useful
    with ``port=0``); stop it with ``server.shutdown()``.

    Raises:
        RqEpochError: prometheus-client is not installed.
        OSError: the address cannot be bound.
    """
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise RqEpochError(_INSTALL_HINT) from exc
    registry: CollectorRegistry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread


def metrics_app(collector: EpochCollector) -> Any:
    """A WSGI application that serves ``collector`` (and nothing else) in Prometheus's text format.

    Raises:
        RqEpochError: prometheus-client is not installed.
    """
    try:
        from prometheus_client import CollectorRegistry, make_wsgi_app
    except ImportError as exc:
        raise RqEpochError(_INSTALL_HINT) from exc
    registry: CollectorRegistry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    return make_wsgi_app(registry)
