"""The exporter's web page: in headless Chromium against real workers, and its HTTP rules.

The browser test builds a counted stall (a SIGKILLed worker) and a dead letter (a poison pill)
with real ``rq worker`` processes, loads the page and the job pages in Chromium and reads the
rendered DOM. Job data carrying markup must stay text: a hostile description or exception
would add a marker element and change ``document.title`` if it ran.

The screenshot goes to the test's temp folder; with ``RQ_EPOCH_PAGE_SCREENSHOT=PATH`` it is
also copied to PATH, relative to the repository's root (docs/monitoring-page.png is made that way:
``RQ_EPOCH_PAGE_SCREENSHOT=docs/monitoring-page.png pytest tests/test_page.py -k browser``).
"""

from __future__ import annotations

import http.server
import os
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import redis
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.page import SECURITY_HEADERS, ExporterApp, PageSettings, WebServer
from rq_epoch.protocol import keys
from rq_epoch.settings import EpochSettings
from tests.browser import Chromium, Dom
from tests.conftest import ROOT, wait_for
from tests.leases import CURRENT, start_job
from tests.test_cli import snapshot
from tests.test_metrics import ExporterProcess
from tests.tools import system_tool

#: The page does not depend on the server kind: one kind is enough.
pytestmark = pytest.mark.parametrize('server', ['valkey'], indirect=True)

#: Would change the title and add #marker if the page let it run or parse as markup.
HOSTILE = (
    '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'"><b id="marker">injected</b>'
)
#: The columns of the table of queues.
COLUMNS = ('queue', 'live', 'expired', 'deferred', 'counted', 'uncounted', 'dead', 'sweep')
HOSTILE_EXCEPTION_TAG = '<img src=x onerror="document.title=\'pwned\'"><i id="marker-exc">injected</i>'


@pytest.fixture
def chromium(tmp_path: Path) -> Chromium:
    scratch = tmp_path / 'chromium'
    scratch.mkdir()
    return Chromium(system_tool('chromium'), scratch)


def get(url: str, method: str = 'GET') -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def working_workers(workers: list[Any]) -> list[Any]:
    return [w for w in workers if w.proc.poll() is None and w.horse_pids()]


def the_one_working(workers: list[Any]) -> list[Any] | None:
    """The one worker with a work-horse, once only one has (an earlier job's horse may still be exiting)."""
    working = working_workers(workers)
    return working if len(working) == 1 else None


def assert_inert(dom: Dom, title: str) -> None:
    """Nothing from the job data ran or became markup."""
    assert dom.title == title
    assert dom.by_id('marker') is None and dom.by_id('marker-exc') is None
    assert not dom.find('img') and not [s for s in dom.find('script')]
    assert 'pwned' not in dom.title


@pytest.mark.slow
def test_the_page_in_a_browser_shows_leases_stalls_and_dead_letters_and_runs_no_job_data(
    server: EmbeddedServer, conn: redis.Redis, start_worker: Callable[..., Any], chromium: Chromium, tmp_path: Path
) -> None:
    queue = Queue('web', connection=conn)
    log, release = str(tmp_path / 'log'), str(tmp_path / 'release')
    # A 5 s lease (1 s heartbeat, 4 s margin): a busy machine does not make a live one expire.
    workers = [start_worker('web', env={'RQ_EPOCH_LEASE_MARGIN': '4'}) for _ in range(3)]

    # A job that failed with markup in its exception text.
    (tmp_path / 'open').touch()
    failed = queue.enqueue('tests.jobs.fail_after_file', log, HOSTILE_EXCEPTION_TAG, str(tmp_path / 'open'))
    wait_for(lambda: failed.get_status(refresh=True) == JobStatus.FAILED, 60, what='the failing job failed')

    # A counted stall and a dead letter at once: the worker running a job is SIGKILLed, and a
    # poison pill with a budget of 1 takes an idle worker down. The third worker's sweep
    # requeues the job (stalled 1/3) and runs it again, and dead-letters the pill.
    stalled = queue.enqueue('tests.jobs.wait_for_file_then_record', log, 's', release, max_stalled=3)
    wait_for(lambda: stalled.get_status(refresh=True) == JobStatus.STARTED, 60, what='the job running')
    [victim] = wait_for(lambda: the_one_working(workers), 10, what='the worker running the job')
    pill = queue.enqueue('tests.jobs.poison_pill', log, 'p', max_stalled=1, description=HOSTILE)
    wait_for(lambda: sum(w.proc.poll() is None for w in workers) == 2, 60, what='the poison pill killing a worker')
    victim.kill()
    wait_for(
        lambda: (
            Job.fetch(stalled.id, connection=conn).stalled == 1
            and working_workers(workers)
            and pill.get_status(refresh=True) == JobStatus.FAILED
            and conn.zcard(keys.finishing_key()) == 0
        ),
        60,
        what='the stall counted, the job running again, the poison pill dead-lettered',
    )
    survivors = [w for w in workers if w.proc.poll() is None]
    assert len(survivors) == 1 and working_workers(survivors)

    exporter = ExporterProcess(['--url', server.url, '--grace', '4'])
    try:
        root = exporter.url.removesuffix('metrics')
        page = chromium.dump_dom(root)
        assert_inert(page, 'rq-epoch: 1 queue(s)')
        assert page.text_of('run-id') == server.run_id()
        [row] = page.find('tr', **{'data-queue': 'web'})
        cells = dict(zip(COLUMNS, row.children, strict=True))
        assert cells['live'].text == '1'  # the job running again
        assert cells['counted'].text == '2'  # one recovered, one dead
        assert cells['uncounted'].text == '0'
        assert cells['dead'].text == '1' and 'bad' in cells['dead'].attrs['class']
        assert 'ok' in cells['sweep'].attrs['class'].split()
        links = {a.attrs['href']: a.text for a in page.find('a', class_='job')}
        assert links == {f'job/{stalled.id}': stalled.id, f'job/{pill.id}': pill.id}
        [stalled_table] = page.find('table', class_='stalled')
        stalled_rows = [r.cells() for r in stalled_table.descendants('tr')[1:]]
        assert [stalled.id, '1/3', 'started'] in [r[:3] for r in stalled_rows]
        assert [pill.id, '1/1', 'failed', HOSTILE] in stalled_rows
        [dead_table] = page.find('table', class_='dead-letters')
        assert [r.cells() for r in dead_table.descendants('tr')[1:]] == [[pill.id, HOSTILE]]

        dead = chromium.dump_dom(urljoin(root, f'job/{pill.id}'))
        assert_inert(dead, f'rq-epoch: job {pill.id}')
        assert dead.text_of('job-description') == HOSTILE
        assert dead.text_of('job-stalled') == '1/1'
        assert dead.text_of('job-dead-letter').startswith('yes')
        assert dead.text_of('job-function') == 'tests.jobs.poison_pill'
        assert 'StalledJobError' in dead.text_of('dead-letter-results')
        assert dead.by_id('back').attrs['href'] == '../'

        running = chromium.dump_dom(urljoin(root, f'job/{stalled.id}'))
        assert_inert(running, f'rq-epoch: job {stalled.id}')
        assert running.text_of('job-stalled') == '1/3'
        assert running.text_of('job-status') == 'started'
        assert running.text_of('job-lease').startswith('live')
        assert server.run_id() in running.text_of('stall-epochs')

        failure = chromium.dump_dom(urljoin(root, f'job/{failed.id}'))
        assert_inert(failure, f'rq-epoch: job {failed.id}')
        assert HOSTILE_EXCEPTION_TAG + ' failed on purpose' in failure.text_of('job-exception')

        shot = chromium.screenshot(root, tmp_path / 'monitoring-page.png')
        print(f'\nscreenshot of the page: {shot}')
        wanted = os.environ.get('RQ_EPOCH_PAGE_SCREENSHOT')
        if wanted:
            copy = ROOT / wanted  # a relative path is taken from the repository's root
            shutil.copyfile(shot, copy)
            print(f'copied to {copy}')
    finally:
        Path(release).touch()
        assert exporter.stop()[0] == 0


class PrefixProxy:
    """A reverse proxy on loopback that serves the exporter under ``/<prefix>/`` (GET only)."""

    def __init__(self, upstream: str, prefix: str) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                if not self.path.startswith(prefix):
                    self.send_error(404)
                    return
                status, headers, body = get(upstream + self.path[len(prefix) :])
                data = body.encode()
                self.send_response(status)
                self.send_header('Content-Type', headers.get('Content-Type', 'text/plain'))
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                outer.paths.append(self.path)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.paths: list[str] = []
        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f'http://127.0.0.1:{self.httpd.server_port}{prefix}'

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def web(conn: redis.Redis) -> Iterator[Callable[..., str]]:
    """The exporter's application in this process, on a free port; returns its root URL."""
    started: list[WebServer] = []

    def serve(page: bool = True, **settings: Any) -> str:
        app = ExporterApp(
            conn, PageSettings(epoch_settings=EpochSettings.resolve(restart_grace=0), **settings), None, page=page
        )
        started.append(WebServer(app, '127.0.0.1', 0).start())
        return f'http://127.0.0.1:{started[-1].port}/'

    yield serve
    for server in started:
        server.stop()


def dead_letter_in(conn: redis.Redis, queue_name: str, **enqueue: Any) -> Job:
    job, _ = start_job(conn, Queue(queue_name, connection=conn), epoch=CURRENT, max_stalled=1, **enqueue)
    Sweeper(conn, restart_grace=0).sweep([queue_name])
    assert job.get_status(refresh=True) == JobStatus.FAILED
    return job


def test_the_page_works_under_a_path_prefix_in_a_browser(
    conn: redis.Redis, web: Callable[..., str], chromium: Chromium
) -> None:
    job = dead_letter_in(conn, 'prefixed')
    proxy = PrefixProxy(web().rstrip('/'), '/ops/rq-epoch')
    try:
        page = chromium.dump_dom(proxy.url + '/')
        assert page.title == 'rq-epoch: 1 queue(s)'
        [href] = {a.attrs['href'] for a in page.find('a', class_='job')}  # in the stalled jobs and the dead letters
        job_url = urljoin(proxy.url + '/', href)
        assert job_url == f'{proxy.url}/job/{job.id}'
        job_page = chromium.dump_dom(job_url)
        assert job_page.text_of('job-id') == job.id
        assert urljoin(job_url, job_page.by_id('back').attrs['href']) == proxy.url + '/'
        assert proxy.paths == ['/ops/rq-epoch/', f'/ops/rq-epoch/job/{job.id}']
    finally:
        proxy.close()


def test_every_link_is_relative_and_markup_in_names_stays_text(conn: redis.Redis, web: Callable[..., str]) -> None:
    name = 'q<b id="marker">"&\''
    job = dead_letter_in(conn, name, description=HOSTILE)
    root = web()
    status, _, body = get(root)
    assert status == 200
    assert HOSTILE not in body and name not in body and '<b id="marker">' not in body
    dom = Dom.parse(body)
    assert dom.by_id('marker') is None and not dom.find('script') and not dom.find('img')
    [row] = dom.find('tr', **{'data-queue': name})
    assert row.children[0].text == name
    hrefs = [a.attrs['href'] for a in dom.find('a')]
    assert f'job/{job.id}' in hrefs
    for href in hrefs:
        assert not href.startswith(('/', '//')) and '://' not in href, href
    status, _, body = get(root + f'job/{job.id}')
    assert status == 200 and HOSTILE not in body
    assert Dom.parse(body).text_of('job-queue') == name


def test_the_page_is_read_only_get_only(conn: redis.Redis, web: Callable[..., str]) -> None:
    job = dead_letter_in(conn, 'ro')
    root = web()
    before = snapshot(conn)
    for path in ('', f'job/{job.id}', 'metrics', 'nothing'):
        for method in ('POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'):
            status, headers, _ = get(root + path, method)
            assert (status, headers.get('Allow')) == (405, 'GET'), (method, path)
    for path in ('', f'job/{job.id}'):
        status, headers, _ = get(root + path)
        assert status == 200
        assert headers['Content-Type'] == 'text/html; charset=utf-8'
        for header, value in SECURITY_HEADERS:
            assert headers[header] == value
    assert snapshot(conn) == before  # nothing written by any of it


def test_unknown_paths_and_jobs_are_404_and_no_page_leaves_only_metrics(
    conn: redis.Redis, web: Callable[..., str]
) -> None:
    root = web()
    assert get(root + 'nothing')[0] == 404
    status, _, body = get(root + 'job/no-such-job')
    assert status == 404 and 'No job no-such-job' in body
    assert get(root + 'metrics')[0] == 404  # this application was given no metrics
    bare = web(page=False)
    assert get(bare)[0] == 404
    assert get(bare + 'job/x')[0] == 404


def test_a_queue_whose_sweeps_stopped_is_red(conn: redis.Redis, web: Callable[..., str]) -> None:
    Queue('swept', connection=conn).enqueue('tests.jobs.add', 1, 2)
    Queue('never', connection=conn).enqueue('tests.jobs.add', 1, 2)
    Sweeper(conn).sweep(['swept'])
    # No cache on the stale one: each load reads the server, so the last sweep's age grows.
    fresh, stale = web(sweeps_stopped_after=3600), web(sweeps_stopped_after=1, cache_seconds=0)

    def sweep_cell(root: str, queue: str) -> Any:
        [row] = Dom.parse(get(root)[2]).find('tr', **{'data-queue': queue})
        return row.children[-1]

    assert 'ok' in sweep_cell(fresh, 'swept').attrs['class'].split()
    assert sweep_cell(fresh, 'never').attrs['class'].split() == ['sweep', 'bad']
    assert sweep_cell(fresh, 'never').text == 'none recorded'
    wait_for(
        lambda: 'bad' in sweep_cell(stale, 'swept').attrs['class'].split(), 10, what='the last sweep older than 1s'
    )


def test_the_page_says_when_it_cannot_read_the_server(
    server: EmbeddedServer, conn: redis.Redis, web: Callable[..., str]
) -> None:
    root = web(cache_seconds=0)  # every load reads the server (the cache has its own tests)
    assert get(root)[0] == 200
    server.stop()
    try:
        status, _, body = get(root)
        assert status == 503
        assert Dom.parse(body).text_of('error').startswith('Cannot read the server: ConnectionError')
    finally:
        server.start()
    wait_for(lambda: get(root)[0] == 200, 30, interval=0.2, what='the page reading the server again')


def test_dead_letters_are_listed_latest_in_the_failed_registry_first(
    conn: redis.Redis, web: Callable[..., str]
) -> None:
    # The failed registry orders by expiry: the failure time plus the job's failure TTL.
    older = dead_letter_in(conn, 'order', failure_ttl=1000)
    newer = dead_letter_in(conn, 'order', failure_ttl=2000)
    [table] = Dom.parse(get(web())[2]).find('table', class_='dead-letters')
    assert [row.cells()[0] for row in table.descendants('tr')[1:]] == [newer.id, older.id]
