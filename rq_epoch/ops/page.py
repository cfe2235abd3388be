"""The exporter's read-only web page: what rq-epoch knows, for a person.

``rq-epoch exporter`` serves it beside the metrics when it listens on loopback, or wherever
``--page`` asks for it, on the metrics' port or its own (``--page-port``):

=================  ====================================================================
path               what it shows
=================  ====================================================================
``/``              the server's epoch (run_id, time as primary, restart grace left) and,
                   per queue, its live, expired and deferred leases, counted stalls and
                   uncounted recoveries, dead letters, the age of the last sweep (red when
                   sweeps stopped), and the jobs with counted stalls and the dead letters,
                   each linking to its job page
``/job/<id>``      one job's stall history, as ``rq-epoch status --job`` shows it, with its
                   function, description and latest exception text
``/metrics``       the Prometheus metrics (:class:`rq_epoch.ops.metrics.EpochCollector`)
=================  ====================================================================

The page writes nothing and has no action: every method but GET is answered ``405``. It is
plain HTML rendered by the server, refreshed by a ``<meta http-equiv="refresh">``, with no
script. Every link is relative, so the page works under any path prefix of a reverse proxy
(the prefix must end with ``/``). Every piece of data from the server -- job ids, function
names, descriptions, exception text, queue names -- is escaped with :func:`html.escape`;
and a ``Content-Security-Policy`` that allows no script stands behind the escaping.

Each view is rendered at most once per refresh period however many people watch it (a
shared :class:`rq_epoch.ops.render_cache.RenderCache`), and may ask for a user and password
(:class:`rq_epoch.ops.access.BasicAuth`); ``/metrics`` never does.
"""

from __future__ import annotations

import html
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis.exceptions
from rq.exceptions import NoSuchJobError

from ..compat import optional_text
from ..errors import RqEpochError
from ..jobs.job import Job
from ..protocol import keys
from ..protocol.server import read_epoch
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings
from .access import BasicAuth
from .formatting import duration
from .history import job_history
from .render_cache import DEFAULT_MAX_ENTRIES, RenderCache
from .status import Status, grace_left, read_status

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    'DEFAULT_REFRESH',
    'DEFAULT_SWEEPS_STOPPED_AFTER',
    'SECURITY_HEADERS',
    'ExporterApp',
    'JobPage',
    'PageSettings',
    'StatusPage',
    'WebServer',
]

logger = logging.getLogger('rq_epoch')

#: Seconds between two reloads of a page.
DEFAULT_REFRESH = 10
#: A queue not swept for longer than this is shown in red (the ``RqEpochSweepsStopped`` alert's threshold).
DEFAULT_SWEEPS_STOPPED_AFTER = 300
#: Jobs listed per queue and kind before "... and N more".
SHOWN_JOBS = 20
#: Characters of a description shown in the list of a queue's jobs (the job page shows it whole).
SHOWN_DESCRIPTION = 300
#: Headers of every answer: no script, no framing, no caching, nothing sent to other sites.
SECURITY_HEADERS = [
    ('Content-Security-Policy', "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"),
    ('X-Content-Type-Options', 'nosniff'),
    ('X-Frame-Options', 'DENY'),
    ('Referrer-Policy', 'no-referrer'),
    ('Cache-Control', 'no-store'),
]

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.bad { background: #fdd; color: #a00; font-weight: bold; }
.warn { background: #ffe9b3; }
code, pre { font-family: ui-monospace, monospace; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: .5em; border: 1px solid #ddd; }
.muted { color: #777; }
"""


def e(value: object) -> str:
    """Text for HTML: every ``& < > " '`` escaped, so data never becomes markup."""
    return html.escape(str(value), quote=True)


def job_link(job_id: str, base: str) -> str:
    """A relative link to a job's page; ``base`` is the way from the current page to the root."""
    return f'<a class="job" href="{e(base + "job/" + quote(job_id, safe=""))}">{e(job_id)}</a>'


def _newest_first(dead_letters: list[str]) -> list[str]:
    """Dead letters as ``rq-epoch status`` lists them (by their place in the failed registry,
    the oldest failure first), newest first."""
    return dead_letters[::-1]


def _shortened(text: str) -> str:
    return text if len(text) <= SHOWN_DESCRIPTION else text[: SHOWN_DESCRIPTION - 1] + '\u2026'


@dataclass(frozen=True)
class PageSettings:
    """How the pages read and show the server."""

    #: Seconds between reloads of a page (its ``<meta http-equiv="refresh">``).
    refresh: int = DEFAULT_REFRESH
    #: A queue whose last sweep is older than this (seconds) is shown in red.
    sweeps_stopped_after: int = DEFAULT_SWEEPS_STOPPED_AFTER
    #: Stall budget and restart grace the verdicts are computed with (as ``rq-epoch status``).
    epoch_settings: EpochSettings | None = None
    #: The queues shown; empty: every queue in RQ's set of queues, read at each request.
    queues: tuple[str, ...] = ()
    #: RQ's job class and serializer, as for ``rq-epoch status``.
    job_class: Any = None
    serializer: Any = None
    #: Seconds a rendered view is shown to every viewer before the server is read again;
    #: None: the refresh period (each view read at most once per period); 0: every load reads.
    cache_seconds: int | None = None
    #: Views kept at most (the status page and the job pages together); the oldest go first.
    cache_entries: int = DEFAULT_MAX_ENTRIES

    @property
    def cache_ttl(self) -> int:
        """Seconds a rendered view is kept (:attr:`cache_seconds`, else :attr:`refresh`)."""
        return self.refresh if self.cache_seconds is None else self.cache_seconds


def document(title: str, body: str, refresh: int) -> str:
    """A whole HTML page around ``body``; ``title`` is escaped here."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{int(refresh)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{e(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n'
        f'<p class="muted">Read-only. Reloads every {int(refresh)}s. rq-epoch.</p>\n</body></html>\n'
    )


class StatusPage:
    """The page at ``/``: the server's epoch and every queue, from :func:`rq_epoch.ops.status.read_status`."""

    def __init__(self, connection: Redis, settings: PageSettings) -> None:
        self.connection = connection
        self.settings = settings

    def render(self) -> str:
        """Read the server (writes nothing) and render the page."""
        s = self.settings
        epoch_settings = s.epoch_settings or EpochSettings.resolve()
        found = read_status(
            self.connection, s.queues, settings=epoch_settings, job_class=s.job_class, serializer=s.serializer
        )
        shown = [job_id for q in found.queues.values() for job_id in self._listed_ids(q)]
        descriptions = self._descriptions(shown)
        parts = ['<h1>rq-epoch</h1>', self._server(found)]
        parts.append(self._queue_table(found))
        for name, q in found.queues.items():
            parts.append(self._queue_jobs(name, q, descriptions))
        return document(f'rq-epoch: {len(found.queues)} queue(s)', '\n'.join(parts), s.refresh)

    @staticmethod
    def _listed_ids(q: dict[str, Any]) -> list[str]:
        return [j['job_id'] for j in q['stalled_jobs'][:SHOWN_JOBS]] + _newest_first(q['dead_letters'])[:SHOWN_JOBS]

    def _descriptions(self, job_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        with self.connection.pipeline(transaction=False) as pipeline:
            for job_id in ids:
                pipeline.hget(keys.job_key(job_id), 'description')
            rows = pipeline.execute(raise_on_error=False)
        return {
            job_id: _shortened(optional_text(row) or '')
            for job_id, row in zip(ids, rows, strict=True)
            if not isinstance(row, Exception)
        }

    def _server(self, found: Status) -> str:
        current, primary = found.current, found.primary
        left = grace_left(primary, found.settings)
        if not primary.is_primary:
            as_primary = f'<span class="bad">not a primary (role {e(current.role or "unknown")})</span>'
        elif not primary.first_seen:
            as_primary = 'not yet seen as primary by a sweep'
        else:
            as_primary = e(duration(primary.age))
            if primary.isolated:
                as_primary += ' <span class="bad">isolated: no replica online</span>'
        grace = 'n/a' if left is None else f'{left}s of {found.settings.grace}s'
        grace_class = ' class="warn"' if left else ''
        rows = [
            ('Server epoch (run_id)', f'<code id="run-id">{e(current.run_id)}</code>'),
            ('Server process up', e(duration(current.uptime))),
            ('Time as primary', f'<span id="primary-for">{as_primary}</span>'),
            ('Restart grace left', f'<span id="grace-left"{grace_class}>{e(grace)}</span>'),
            ('Stall budget', f'{found.settings.max_stalled} (jobs enqueued with max_stalled use their own)'),
        ]
        cells = ''.join(f'<tr><th>{label}</th><td>{value}</td></tr>' for label, value in rows)
        return f'<table id="server">{cells}</table>'

    def _queue_table(self, found: Status) -> str:
        head = (
            '<tr><th>queue</th><th>live leases</th><th>expired leases</th><th>deferred leases</th>'
            '<th>counted stalls (total)</th><th>uncounted recoveries (total)</th><th>dead letters</th>'
            '<th>last sweep</th></tr>'
        )
        if not found.queues:
            return '<p id="no-queues">No queues.</p>'
        rows = []
        for name, q in found.queues.items():
            expired = q['expired']
            deferred = expired.get(Verdict.DEFERRED.value, 0)
            counters = q['counters']
            counted = counters.get(Verdict.RECOVERED.value, 0) + counters.get(Verdict.DEAD.value, 0)
            # Requeued without a counted stall: after a restart (exempt), or a deploy (handed
            # back by the worker, or stopping: its worker was killed before it could).
            uncounted = (
                counters.get(Verdict.EXEMPT.value, 0)
                + counters.get(Verdict.STOPPING.value, 0)
                + counters.get('handed_back', 0)
            )
            live = f'{q["live_leases"]}'
            if q['stock_live_leases']:
                live += f' (+{q["stock_live_leases"]} stock)'
            waiting = q['expired_leases'] - deferred
            detail = f' ({q["would_be_counted"]} counted)' if waiting else ''
            cells = [
                f'<td class="queue"><a href="#queue-{e(quote(name, safe=""))}">{e(name)}</a></td>',
                f'<td class="n live">{e(live)}</td>',
                f'<td class="n expired">{waiting}{detail}</td>',
                f'<td class="n deferred">{deferred}</td>',
                f'<td class="n counted">{counted}</td>',
                f'<td class="n uncounted">{uncounted}</td>',
                f'<td class="n dead{" bad" if q["dead_letters"] else ""}">{len(q["dead_letters"])}</td>',
                self._last_sweep_cell(q['seconds_since_last_sweep']),
            ]
            rows.append(f'<tr data-queue="{e(name)}">{"".join(cells)}</tr>')
        return f'<h2>Queues</h2><table id="queues">{head}{"".join(rows)}</table>'

    def _last_sweep_cell(self, since: float | None) -> str:
        limit = self.settings.sweeps_stopped_after
        if since is None:
            return '<td class="sweep bad" title="no rq-epoch sweep was ever recorded">none recorded</td>'
        if since > limit:
            return f'<td class="sweep bad" title="sweeps stopped (more than {limit}s)">{e(duration(since))} ago</td>'
        return f'<td class="sweep ok">{e(duration(since))} ago</td>'

    def _queue_jobs(self, name: str, q: dict[str, Any], descriptions: dict[str, str]) -> str:
        parts = [f'<h2 id="queue-{e(quote(name, safe=""))}">Queue {e(name)}</h2>']
        stalled = q['stalled_jobs']
        dead = q['dead_letters']
        if stalled:
            rows = ''.join(
                f'<tr><td>{job_link(j["job_id"], "")}</td><td class="n">{int(j["stalled"])}/{int(j["max_stalled"])}'
                f'</td><td>{e(j["status"])}</td><td>{e(descriptions.get(j["job_id"], ""))}</td></tr>'
                for j in stalled[:SHOWN_JOBS]
            )
            parts.append(
                '<h3>Jobs with counted stalls</h3><table class="stalled">'
                f'<tr><th>job</th><th>stalled</th><th>status</th><th>description</th></tr>{rows}</table>'
            )
            parts.append(self._more(len(stalled)))
        if dead:
            rows = ''.join(
                f'<tr><td>{job_link(job_id, "")}</td><td>{e(descriptions.get(job_id, ""))}</td></tr>'
                for job_id in _newest_first(dead)[:SHOWN_JOBS]
            )
            parts.append(
                '<h3>Dead letters (newest first)</h3><table class="dead-letters">'
                f'<tr><th>job</th><th>description</th></tr>{rows}</table>'
            )
            parts.append(self._more(len(dead)))
        if not stalled and not dead:
            parts.append('<p class="muted">No job with counted stalls, no dead letter.</p>')
        if q['truncated']:
            parts.append('<p class="warn">Only the first entries of each registry were read.</p>')
        return '\n'.join(p for p in parts if p)

    @staticmethod
    def _more(total: int) -> str:
        if total <= SHOWN_JOBS:
            return ''
        return f'<p class="muted">... and {total - SHOWN_JOBS} more (rq-epoch status --json lists them all).</p>'


class JobPage:
    """The page at ``/job/<id>``: what ``rq-epoch status --job`` shows, and the job's own text."""

    def __init__(self, connection: Redis, settings: PageSettings) -> None:
        self.connection = connection
        self.settings = settings

    def render(self, job_id: str) -> str:
        """Read the job (writes nothing) and render its page.

        Raises:
            rq.exceptions.NoSuchJobError: there is no such job.
        """
        s = self.settings
        epoch_settings = s.epoch_settings or EpochSettings.resolve()
        current = read_epoch(self.connection)
        job_class = s.job_class or Job
        history = job_history(
            self.connection,
            job_id,
            run_id=current.run_id,
            default_max_stalled=epoch_settings.max_stalled,
            job_class=job_class,
            serializer=s.serializer,
        )
        job = job_class.fetch(job_id, connection=self.connection, serializer=s.serializer)
        rows = [
            ('Job', f'<code id="job-id">{e(history["job_id"])}</code>'),
            ('Queue', f'<span id="job-queue">{e(history["queue"])}</span>'),
            ('Status', f'<span id="job-status">{e(history["status"])}</span>'),
            ('Function', f'<code id="job-function">{e(self._function(job))}</code>'),
            ('Description', f'<span id="job-description">{e(getattr(job, "description", "") or "")}</span>'),
        ]
        rows += self._history_rows(history, current.run_id)
        cells = ''.join(f'<tr><th>{label}</th><td>{value}</td></tr>' for label, value in rows)
        parts = [
            '<p><a id="back" href="../">&larr; all queues</a></p>',
            f'<h1>Job {e(history["job_id"])}</h1>',
            f'<table id="job">{cells}</table>',
        ]
        results = history['dead_letter_results']
        if results:
            items = ''.join(
                f'<li><span class="when">{e(r["created_at"] or "?")}</span><pre>{e(r["reason"])}</pre></li>'
                for r in results
            )
            parts.append(f'<h2>Dead-lettered</h2><ul id="dead-letter-results">{items}</ul>')
        exception = self._latest_exception(job)
        if exception and exception not in {r['reason'] for r in results}:
            parts.append(f'<h2>Latest exception</h2><pre id="job-exception">{e(exception)}</pre>')
        return document(f'rq-epoch: job {job_id}', '\n'.join(parts), s.refresh)

    @staticmethod
    def _function(job: Any) -> str:
        try:
            return str(job.func_name)
        except Exception:  # the job's data cannot be read with this serializer: show nothing, not an error
            return '(cannot be read)'

    @staticmethod
    def _latest_exception(job: Any) -> str:
        latest = getattr(job, 'latest_result', None)
        try:
            result = latest() if callable(latest) else None
        except Exception:
            result = None
        text = getattr(result, 'exc_string', None) if result is not None else None
        return str(text or getattr(job, 'exc_info', None) or '')

    @staticmethod
    def _history_rows(history: dict[str, Any], run_id: str) -> list[tuple[str, str]]:
        source = "the job's own" if history['max_stalled_source'] == 'job' else 'the default'
        rows = [
            (
                'Counted stalls',
                f'<span id="job-stalled">{int(history["stalled"])}/{int(history["max_stalled"])}</span> '
                f'(budget: {source})',
            ),
        ]
        counts: dict[str, int] = {}
        for epoch in history['stall_epochs']:
            counts[epoch] = counts.get(epoch, 0) + 1
        if counts:
            here = ' (the current server process)'
            items = ''.join(
                f'<li><code>{e(epoch)}</code> &times;{n}{here if epoch == run_id else ""}</li>'
                for epoch, n in counts.items()
            )
            rows.append(('Counted under', f'<ul id="stall-epochs">{items}</ul>'))
        rows.append(
            (
                'Uncounted recoveries',
                f'<span id="job-exempt">{int(history["exempt_recoveries"])}</span> '
                '(leases that crossed a restart, not counted)',
            )
        )
        rows.append(
            (
                'Handed back',
                f'<span id="job-handed-back">{int(history["handed_back"])}</span> by a worker told to stop, '
                f'<span id="job-stopping">{int(history["stopping_recoveries"])}</span> by a sweep after its '
                'worker was killed while stopping (not counted)',
            )
        )
        stamp = e(history['lease_epoch'] or '(none)')
        whose = 'the current server process' if history['lease_epoch_is_current'] else 'another server process'
        lease = history['lease']
        if lease is None:
            shown = f'none (last stamp <code>{stamp}</code>)'
        elif lease['expired']:
            shown = (
                f'<span class="warn">expired {-lease["seconds_left"]:.1f}s ago</span>, stamped by '
                f'<code>{stamp}</code> ({whose}): waiting for a sweep'
            )
        else:
            shown = f'live, {lease["seconds_left"]:.1f}s left, stamped by <code>{stamp}</code> ({whose})'
        rows.append(('Lease', f'<span id="job-lease">{shown}</span>'))
        dead = '<span class="bad">yes (failed, in FailedJobRegistry)</span>' if history['dead_letter'] else 'no'
        rows.append(('Dead letter', f'<span id="job-dead-letter">{dead}</span>'))
        rows.append(('Requeued since', 'yes' if history['requeued_since_dead_letter'] else 'no'))
        return rows


class ExporterApp:
    """The exporter's WSGI application: the pages (unless turned off) and ``/metrics``. GET only.

    ``auth``: the user and password the pages ask for (``/metrics`` never asks); None: none.
    Each view goes through one shared :class:`RenderCache` (:attr:`cache`).
    """

    def __init__(
        self,
        connection: Redis,
        settings: PageSettings,
        metrics: WsgiApp | None,
        *,
        page: bool = True,
        auth: BasicAuth | None = None,
    ) -> None:
        self.connection = connection
        self.settings = settings
        self.metrics = metrics
        self.page = page
        self.auth = auth
        self.status_page = StatusPage(connection, settings)
        self.job_page = JobPage(connection, settings)
        #: The rendered views, each an HTTP status and a page.
        self.cache: RenderCache[tuple[str, str]] = RenderCache(settings.cache_ttl, settings.cache_entries)
        self._last_error = ''

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get('REQUEST_METHOD', 'GET')
        path = environ.get('PATH_INFO', '') or '/'
        if method != 'GET':
            return self._answer(start_response, '405 Method Not Allowed', 'Read-only: GET only.', [('Allow', 'GET')])
        if path == '/metrics' and self.metrics is not None:
            return self.metrics(environ, start_response)
        if not self.page:
            return self._answer(start_response, '404 Not Found', 'Not found.')
        if self.auth is not None and not self.auth.allows(environ.get('HTTP_AUTHORIZATION')):
            challenge = [('WWW-Authenticate', self.auth.challenge)]
            return self._answer(start_response, '401 Unauthorized', 'Authentication required.', challenge)
        if path == '/':
            return self._view(start_response, path, self.status_page.render)
        if path.startswith('/job/') and len(path) > len('/job/'):
            job_id = path[len('/job/') :]
            return self._view(start_response, path, lambda: self.job_page.render(job_id), job_id=job_id)
        return self._answer(start_response, '404 Not Found', 'Not found.')

    def _view(
        self, start_response: Callable[..., Any], key: str, render: Callable[[], str], job_id: str = ''
    ) -> list[bytes]:
        """Answer with the view ``key``, rendered at most once per cache period for every viewer."""
        status, page = self.cache.get(key, lambda: self._render(render, job_id))
        return self._html(start_response, status, page)

    def _render(self, render: Callable[[], str], job_id: str = '') -> tuple[str, str]:
        """Read the server and render: the HTTP status and the page (an error page when the read fails)."""
        back = '../' if job_id else ''
        try:
            body = render()
        except NoSuchJobError:
            page = document(
                'rq-epoch: no such job',
                f'<p><a id="back" href="{back}">&larr; all queues</a></p><p id="error">No job {e(job_id)}.</p>',
                self.settings.refresh,
            )
            return '404 Not Found', page
        except (redis.exceptions.RedisError, RqEpochError) as exc:
            if type(exc).__name__ != self._last_error:  # once per kind of error, until a read succeeds
                logger.warning('page: cannot read the server: %s: %s', type(exc).__name__, exc)
                self._last_error = type(exc).__name__
            page = document(
                'rq-epoch: cannot read the server',
                f'<p id="error" class="bad">Cannot read the server: {e(type(exc).__name__)}: {e(exc)}</p>',
                self.settings.refresh,
            )
            return '503 Service Unavailable', page
        self._last_error = ''
        return '200 OK', body

    @staticmethod
    def _html(start_response: Callable[..., Any], status: str, page: str) -> list[bytes]:
        data = page.encode('utf-8')
        headers = [('Content-Type', 'text/html; charset=utf-8'), ('Content-Length', str(len(data)))]
        start_response(status, headers + SECURITY_HEADERS)
        return [data]

    @staticmethod
    def _answer(
        start_response: Callable[..., Any], status: str, message: str, extra: Sequence[tuple[str, str]] = ()
    ) -> list[bytes]:
        data = (message + '\n').encode()
        headers = [('Content-Type', 'text/plain; charset=utf-8'), ('Content-Length', str(len(data))), *extra]
        start_response(status, headers + SECURITY_HEADERS)
        return [data]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    #: Connections waiting to be accepted (socketserver's 5 drops the connections of many
    #: viewers arriving at once, and each one dropped retries a second later).
    request_queue_size = 128


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the signature of BaseHTTPRequestHandler
        pass


class WebServer:
    """A WSGI application served on ``host:port`` by a daemon thread (a request per thread)."""

    def __init__(self, app: WsgiApp, host: str = '127.0.0.1', port: int = 0) -> None:
        """Bind the address (``port=0``: any free port, see :attr:`port`).

        Raises:
            OSError: the address cannot be bound.
        """
        server_class = _ThreadingServer6 if ':' in host else _ThreadingServer
        self.httpd = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name='rq-epoch-web', daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    def start(self) -> WebServer:
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout)
