"""The page's shared cache: each view read from the server once per period, however many watch.

The server's own count of the commands it ran (``INFO commandstats``) is the measure: N
concurrent viewers of the real exporter cost the server one render, where the exporter
without a cache costs it N. A render held in flight by the :class:`~tests.proxy.HoldingProxy`
shows the other viewers waiting for it instead of reading the server themselves.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rq_epoch import Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.page import ExporterApp, PageSettings, StatusPage, WebServer
from rq_epoch.ops.render_cache import RenderCache
from rq_epoch.settings import EpochSettings
from tests.conftest import wait_for
from tests.proxy import HoldingProxy
from tests.test_metrics import ExporterProcess
from tests.test_page import dead_letter_in

#: The page does not depend on the server kind: one kind is enough.
valkey_only = pytest.mark.parametrize('server', ['valkey'], indirect=True)
#: Concurrent viewers.
VIEWERS = 20
#: Commands a client sends to open a connection, not to read anything.
CONNECTING = ('client|', 'hello', 'select', 'auth')


def commands_run(conn: redis.Redis) -> dict[str, int]:
    """Calls per command so far, as the server counts them."""
    return {name.removeprefix('cmdstat_'): int(v['calls']) for name, v in conn.info('commandstats').items()}


def reads_between(before: dict[str, int], after: dict[str, int]) -> int:
    """Commands run between two :func:`commands_run`, but the INFO that took ``before`` and the
    commands that open connections."""
    delta = {k: v - before.get(k, 0) for k, v in after.items() if not k.startswith(CONNECTING)}
    delta['info'] = delta.get('info', 0) - 1
    return sum(delta.values())


def fetch(url: str) -> tuple[int, bytes]:
    assert url.startswith('http://127.0.0.1:'), url
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status, response.read()


def all_at_once(url: str, viewers: int = VIEWERS) -> list[tuple[int, bytes]]:
    """``viewers`` GETs of ``url`` from as many threads, released together."""
    start = threading.Barrier(viewers)
    answers: list[Any] = [None] * viewers

    def view(i: int) -> None:
        start.wait(30)
        answers[i] = fetch(url)

    threads = [threading.Thread(target=view, args=(i,)) for i in range(viewers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(a is not None for a in answers), 'a viewer got no answer'
    return answers


def server_cost(conn: redis.Redis, action: Callable[[], Any]) -> tuple[int, Any]:
    before = commands_run(conn)
    result = action()
    return reads_between(before, commands_run(conn)), result


@pytest.fixture
def state(conn: redis.Redis) -> str:
    """Two queues, one with a dead letter; the id of the dead letter."""
    Queue('waiting', connection=conn).enqueue('tests.jobs.add', 1, 2)
    return dead_letter_in(conn, 'cached').id


@pytest.fixture
def exporters() -> Iterator[Callable[..., ExporterProcess]]:
    started: list[ExporterProcess] = []

    def start(*args: str) -> ExporterProcess:
        started.append(ExporterProcess(list(args)))
        return started[-1]

    yield start
    for exporter in started:
        exporter.stop()


@valkey_only
def test_concurrent_viewers_of_the_real_exporter_cost_the_server_one_render(
    server: EmbeddedServer, conn: redis.Redis, exporters: Callable[..., ExporterProcess], state: str
) -> None:
    # --refresh 3600: the cache keeps each view an hour, longer than the test.
    uncached = exporters('--url', server.url, '--refresh', '3600', '--page-cache', '0').url.removesuffix('metrics')
    cached = exporters('--url', server.url, '--refresh', '3600').url.removesuffix('metrics')
    for view in ('', f'job/{state}'):
        one_render, (status, page) = server_cost(conn, lambda: fetch(uncached + view))  # noqa: B023
        assert status == 200 and one_render > 0
        without_cache, answers = server_cost(conn, lambda: all_at_once(uncached + view))  # noqa: B023
        assert {status for status, _ in answers} == {200}
        assert without_cache == VIEWERS * one_render, view

        with_cache, answers = server_cost(conn, lambda: all_at_once(cached + view))  # noqa: B023
        assert {status for status, _ in answers} == {200}
        assert len({body for _, body in answers}) == 1  # one render, shown to every viewer
        assert with_cache == one_render, view
        again, (status, body) = server_cost(conn, lambda: fetch(cached + view))  # noqa: B023
        assert (again, status, body) == (0, 200, answers[0][1])


@pytest.fixture
def app_through(proxy: HoldingProxy) -> Iterator[Callable[..., tuple[ExporterApp, str]]]:
    """The exporter's application in this process, reading the server through the proxy."""
    started: list[WebServer] = []

    def serve(**settings: Any) -> tuple[ExporterApp, str]:
        client = redis.Redis.from_url(proxy.url)
        app = ExporterApp(client, PageSettings(epoch_settings=EpochSettings.resolve(restart_grace=0), **settings), None)
        started.append(WebServer(app, '127.0.0.1', 0).start())
        return app, f'http://127.0.0.1:{started[-1].port}/'

    yield serve
    for web in started:
        web.stop()


@valkey_only
def test_viewers_arriving_while_a_view_renders_wait_for_that_render(
    conn: redis.Redis, proxy: HoldingProxy, app_through: Callable[..., tuple[ExporterApp, str]], state: str
) -> None:
    settings = PageSettings(epoch_settings=EpochSettings.resolve(restart_grace=0))
    one_render, _ = server_cost(conn, StatusPage(conn, settings).render)
    app, root = app_through(refresh=3600)
    proxy.hold(b'$4\r\nINFO\r\n')  # the render's first read: INFO server, for the epoch
    answers: list[Any] = []
    before = commands_run(conn)
    viewers = [threading.Thread(target=lambda: answers.append(fetch(root))) for _ in range(VIEWERS)]
    for viewer in viewers:
        viewer.start()
    assert proxy.held.wait(30), 'the render never read the server'
    wait_for(lambda: app.cache.stats().waiting == VIEWERS - 1, 30, what='every other viewer waiting for the render')
    assert reads_between(before, commands_run(conn)) == 0  # none of them read the server themselves
    proxy.release()
    for viewer in viewers:
        viewer.join(60)
    assert reads_between(before, commands_run(conn)) == one_render + 1  # + the INFO that counted in between
    assert len(answers) == VIEWERS and len({a for a in answers}) == 1 and answers[0][0] == 200
    stats = app.cache.stats()
    assert (stats.renders, stats.shared, stats.hits, stats.waiting) == (1, VIEWERS - 1, 0, 0)


@valkey_only
def test_a_view_is_read_again_once_its_period_is_over(
    conn: redis.Redis, proxy: HoldingProxy, app_through: Callable[..., tuple[ExporterApp, str]], state: str
) -> None:
    app, root = app_through(refresh=1)
    first, _ = server_cost(conn, lambda: fetch(root))
    assert first > 0
    wait_for(lambda: server_cost(conn, lambda: fetch(root))[0] > 0, 30, what='the view read again after its second')
    assert app.cache.stats().renders >= 2


@valkey_only
def test_job_pages_are_bounded_and_the_oldest_goes_first(
    conn: redis.Redis, proxy: HoldingProxy, app_through: Callable[..., tuple[ExporterApp, str]], state: str
) -> None:
    app, root = app_through(refresh=3600, cache_entries=3)
    ids = [state, *(dead_letter_in(conn, 'cached').id for _ in range(3))]
    for job_id in ids:
        assert server_cost(conn, lambda: fetch(f'{root}job/{job_id}'))[0] > 0  # noqa: B023
    assert app.cache.stats().entries == 3
    for job_id in ids[1:]:  # kept
        assert server_cost(conn, lambda: fetch(f'{root}job/{job_id}'))[0] == 0  # noqa: B023
    assert server_cost(conn, lambda: fetch(f'{root}job/{ids[0]}'))[0] > 0  # the oldest went
    assert app.cache.stats().entries == 3


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cache_keeps_a_view_for_its_period_and_bounds_its_entries() -> None:
    clock = Clock()
    cache: RenderCache[str] = RenderCache(10, max_entries=2, clock=clock)
    rendered: list[str] = []

    def render(key: str) -> Callable[[], str]:
        return lambda: rendered.append(key) or f'{key}@{clock.now}'

    assert cache.get('a', render('a')) == 'a@100.0'
    clock.now = 109.9
    assert cache.get('a', render('a')) == 'a@100.0'
    clock.now = 110.0
    assert cache.get('a', render('a')) == 'a@110.0'
    cache.get('b', render('b'))
    cache.get('c', render('c'))  # a third entry: the oldest rendered (a) goes
    assert rendered == ['a', 'a', 'b', 'c']
    cache.get('b', render('b'))
    cache.get('a', render('a'))
    assert rendered == ['a', 'a', 'b', 'c', 'a']
    clock.now = 1000.0  # everything expired: dropped at the next render
    cache.get('d', render('d'))
    assert cache.stats().entries == 1
    assert cache.stats().hits == 2


def test_cache_with_no_period_is_no_cache() -> None:
    cache: RenderCache[int] = RenderCache(0)
    calls: list[int] = []
    assert cache.get('a', lambda: calls.append(1) or 1) == 1
    assert cache.get('a', lambda: calls.append(2) or 2) == 2
    assert (cache.stats().entries, cache.stats().renders) == (0, 2)


def test_a_failed_render_is_shared_with_its_waiters_and_not_kept() -> None:
    cache: RenderCache[str] = RenderCache(60)
    started, finish = threading.Event(), threading.Event()

    def failing() -> str:
        started.set()
        assert finish.wait(30)
        raise redis.exceptions.ConnectionError('gone')

    errors: list[BaseException] = []

    def view() -> None:
        try:
            cache.get('a', failing)
        except redis.exceptions.ConnectionError as exc:
            errors.append(exc)

    leader = threading.Thread(target=view)
    leader.start()
    assert started.wait(30)
    followers = [threading.Thread(target=view) for _ in range(3)]
    for follower in followers:
        follower.start()
    wait_for(lambda: cache.stats().waiting == 3, 30, what='three requests waiting for the render')
    finish.set()
    for thread in [leader, *followers]:
        thread.join(30)
    assert len(errors) == 4 and len({id(exc) for exc in errors}) == 1
    assert cache.stats().entries == 0
    assert cache.get('a', lambda: 'fine') == 'fine'  # the next request renders again
