"""Who can see the exporter's page: the real ``rq-epoch exporter`` on loopback and on a wildcard
address, in headless Chromium.

On loopback the page is served beside ``/metrics``; bound to every interface (``0.0.0.0``,
reached here through 127.0.0.1 only) the exporter serves ``/metrics`` alone unless ``--page``
asks for the page, and says at start what it serves and to whom. With a user and password
(from the environment or a file, never the command line) the page answers ``401`` without
them or with wrong ones, and shows the same page, escaping unchanged, with them; ``/metrics``
never asks.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import redis
from click.testing import CliRunner

from rq_epoch import Job
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.access import PASSWORD_VARIABLE, USER_VARIABLE, is_loopback
from rq_epoch.ops.cli import main
from tests.browser import Chromium, Dom
from tests.test_metrics import ExporterProcess, loopback_url, scrape_up
from tests.test_page import HOSTILE, assert_inert, dead_letter_in
from tests.tools import system_tool

#: The page does not depend on the server kind: one kind is enough.
valkey_only = pytest.mark.parametrize('server', ['valkey'], indirect=True)

USER, PASSWORD = 'alice', 'pa:ss word\u00e9'  # a ':' and a non-ASCII letter in the password
CREDENTIALS = {USER_VARIABLE: USER, PASSWORD_VARIABLE: PASSWORD}
CHALLENGE = 'Basic realm="rq-epoch", charset="UTF-8"'


def get(url: str, user: str | None = None, password: str | None = None) -> tuple[int, dict[str, str], str]:
    """GET ``url`` on loopback, with HTTP basic authentication when a user is given."""
    url = loopback_url(url)
    assert is_loopback(urllib.parse.urlsplit(url).hostname or ''), url  # tests connect to loopback only
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f'{user}:{password}'.encode()).decode()
        request.add_header('Authorization', f'Basic {token}')
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` with the user and password in it, as a browser takes them (percent-encoded)."""
    quote = urllib.parse.quote
    scheme, _, rest = loopback_url(url).partition('://')
    return f'{scheme}://{quote(user, safe="")}:{quote(password, safe="")}@{rest}'


def page_root(exporter: ExporterProcess, line: str) -> str:
    """The page's address from the exporter's line ``rq-epoch exporter: page at URL (...)``."""
    assert line.startswith('rq-epoch exporter: page at http://'), line
    return line.split()[4]


@pytest.fixture
def chromium(tmp_path: Path) -> Chromium:
    scratch = tmp_path / 'chromium'
    scratch.mkdir()
    return Chromium(system_tool('chromium'), scratch)


@pytest.fixture
def exporters() -> Iterator[Callable[..., ExporterProcess]]:
    started: list[ExporterProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ExporterProcess:
        started.append(ExporterProcess(list(args), env))
        return started[-1]

    yield start
    for exporter in started:
        exporter.stop()


@pytest.fixture
def dead_letter(conn: redis.Redis) -> Job:
    """A dead letter whose description is hostile markup."""
    return dead_letter_in(conn, 'exposed', description=HOSTILE)


def assert_page(chromium: Chromium, root: str, job: Job) -> None:
    """The page and the job's page, as a browser renders them: the data there, and inert."""
    page = chromium.dump_dom(root)
    assert_inert(page, 'rq-epoch: 1 queue(s)')
    assert {a.attrs['href'] for a in page.find('a', class_='job')} == {f'job/{job.id}'}
    job_page = chromium.dump_dom(urljoin(root, f'job/{job.id}'))
    assert_inert(job_page, f'rq-epoch: job {job.id}')
    assert job_page.text_of('job-description') == HOSTILE


def assert_asks_for_password(chromium: Chromium, url: str) -> None:
    """``401`` with the challenge, and the browser shows nothing of the page (headless, it has no
    prompt to ask for the password: it shows an empty document)."""
    status, headers, body = get(url)
    assert (status, headers.get('WWW-Authenticate'), body) == (401, CHALLENGE, 'Authentication required.\n')
    assert_nothing_shown(chromium.dump_dom(url))


def assert_nothing_shown(dom: Dom) -> None:
    assert 'exposed' not in dom.source and 'job/' not in dom.source and not dom.find('table'), dom.source


@valkey_only
def test_on_loopback_the_page_is_served_beside_the_metrics(
    server: EmbeddedServer, exporters: Callable[..., ExporterProcess], chromium: Chromium, dead_letter: Job
) -> None:
    exporter = exporters('--url', server.url)
    root = exporter.url.removesuffix('metrics')
    line = exporter.line()
    assert page_root(exporter, line) == root
    assert line.endswith('open to this machine only (loopback), without a password')
    assert_page(chromium, root, dead_letter)
    scrape_up(exporter.url)


@valkey_only
@pytest.mark.parametrize('host', ['localhost', '::1', '127.0.0.2'])
def test_every_loopback_address_serves_the_page(
    server: EmbeddedServer, exporters: Callable[..., ExporterProcess], dead_letter: Job, host: str
) -> None:
    if host == '::1' and not socket.has_ipv6:
        pytest.skip('no IPv6 on this machine')
    exporter = exporters('--url', server.url, '--host', host)
    root = page_root(exporter, exporter.line())
    status, _, body = get(urljoin(root, f'job/{dead_letter.id}'))
    assert status == 200 and dead_letter.id in body


@valkey_only
@pytest.mark.parametrize('host', ['0.0.0.0', '::'])
def test_beyond_loopback_only_the_metrics_are_served(
    server: EmbeddedServer,
    exporters: Callable[..., ExporterProcess],
    chromium: Chromium,
    dead_letter: Job,
    host: str,
) -> None:
    if host == '::' and not socket.has_ipv6:
        pytest.skip('no IPv6 on this machine')
    exporter = exporters('--url', server.url, '--host', host)
    assert exporter.line() == (
        f'rq-epoch exporter: no page: {host} is beyond loopback '
        '(--page serves it there, --page-port P serves it on 127.0.0.1:P)'
    )
    root = exporter.url.removesuffix('metrics')
    assert root.startswith(('http://127.0.0.1:', 'http://[::1]:'))
    scrape_up(exporter.url)
    for path in ('', f'job/{dead_letter.id}'):
        status, _, body = get(root + path)
        assert (status, body) == (404, 'Not found.\n')
    dom = chromium.dump_dom(root)
    assert 'Not found.' in dom.source and 'exposed' not in dom.source and not dom.find('table')
    assert exporter.stop() == (0, '')


@valkey_only
def test_beyond_loopback_the_page_asked_for_asks_for_the_password(
    server: EmbeddedServer, exporters: Callable[..., ExporterProcess], chromium: Chromium, dead_letter: Job
) -> None:
    exporter = exporters('--url', server.url, '--host', '0.0.0.0', '--page', env=CREDENTIALS)
    line = exporter.line()
    root = loopback_url(page_root(exporter, line))
    assert root == exporter.url.removesuffix('metrics')
    port = root.rsplit(':', 1)[1].strip('/')
    assert line.endswith(
        f'open to anyone who can reach port {port} of this machine, on any interface, with the password of user '
        f"'{USER}' (HTTP basic authentication)"
    )
    assert PASSWORD not in ' '.join(exporter.proc.args)  # the command line, as ps shows it

    assert_page(chromium, with_credentials(root, USER, PASSWORD), dead_letter)
    status, _, body = get(urljoin(root, f'job/{dead_letter.id}'), USER, PASSWORD)
    assert status == 200 and dead_letter.id in body and HOSTILE not in body
    for path in ('', f'job/{dead_letter.id}', 'job/no-such-job', 'nothing'):
        assert_asks_for_password(chromium, root + path)
    for user, password in ((USER, 'wrong'), ('mallory', PASSWORD), (USER, PASSWORD[:-1]), (USER, '')):
        assert get(root, user, password)[0] == 401
        assert_nothing_shown(chromium.dump_dom(with_credentials(root, user, password) if password else root))
    scrape_up(exporter.url)  # /metrics keeps Prometheus' conventions: no password asked
    code, err = exporter.stop()
    assert code == 0 and 'WARNING' not in err


@valkey_only
def test_beyond_loopback_the_page_without_a_password_is_said_at_start(
    server: EmbeddedServer, exporters: Callable[..., ExporterProcess], dead_letter: Job
) -> None:
    exporter = exporters('--url', server.url, '--host', '0.0.0.0', '--page')
    line = exporter.line()
    assert line.endswith('on any interface, without a password'), line
    assert get(loopback_url(page_root(exporter, line)))[0] == 200
    code, err = exporter.stop()
    assert code == 0
    assert err.count('WARNING: the page is served beyond loopback without a password') == 1


@valkey_only
def test_the_page_on_its_own_listener_with_a_credentials_file(
    server: EmbeddedServer,
    exporters: Callable[..., ExporterProcess],
    chromium: Chromium,
    dead_letter: Job,
    tmp_path: Path,
) -> None:
    secret = tmp_path / 'page-auth'
    secret.write_text(f'{USER}:{PASSWORD}\n', encoding='utf-8')
    secret.chmod(0o600)
    exporter = exporters('--url', server.url, '--host', '0.0.0.0', '--page-port', '0', '--page-auth-file', str(secret))
    line = exporter.line()
    root = page_root(exporter, line)
    assert root.startswith('http://127.0.0.1:') and root != exporter.url.removesuffix('metrics')
    assert line.endswith(
        f"open to this machine only (loopback), with the password of user '{USER}' (HTTP basic authentication)"
    )
    # The metrics' listener serves the metrics alone.
    scrape_up(exporter.url)
    assert get(exporter.url.removesuffix('metrics'), USER, PASSWORD)[0] == 404
    # The page's listener serves the page alone, to who gives the password.
    assert_page(chromium, with_credentials(root, USER, PASSWORD), dead_letter)
    assert_asks_for_password(chromium, root)
    assert get(root + 'metrics', USER, PASSWORD)[0] == 404
    assert get(root + 'metrics')[0] == 401


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    clean = {k: None for k in os.environ if k.startswith(('RQ_', 'REDIS_'))}
    runner = CliRunner()
    return runner.invoke(main, ['exporter', '--url', 'redis://127.0.0.1:1/0', *args], env={**clean, **(env or {})})


@pytest.mark.parametrize(
    ('args', 'env', 'message'),
    [
        (['--page-host', '127.0.0.1'], {}, '--page-host needs --page-port'),
        (['--no-page', '--page-port', '0'], {}, '--no-page contradicts --page-port'),
        (['--no-page', '--page-auth-file', '{file}'], {}, '--no-page contradicts --page-auth-file'),
        (
            ['--host', '0.0.0.0', '--page-host', '0.0.0.0', '--page-port', '0'],
            {},
            '--page-host 0.0.0.0 is beyond loopback: add --page',
        ),
        (['--host', '0.0.0.0', '--page-auth-file', '{file}'], {}, 'off beyond loopback (0.0.0.0): add --page'),
        (['--port', '9999', '--page-port', '9999'], {}, '--page-port 9999 is the metrics port'),
        ([], {USER_VARIABLE: USER}, f'{USER_VARIABLE} and {PASSWORD_VARIABLE} go together'),
        ([], {USER_VARIABLE: 'a:b', PASSWORD_VARIABLE: 'x'}, 'may not contain ":"'),
        ([], {USER_VARIABLE: USER, PASSWORD_VARIABLE: ''}, 'both a user and a password'),
        (['--page-auth-file', '{file}'], CREDENTIALS, 'the page credentials are given twice'),
        (['--page-auth-file', '{bad}'], {}, 'the first line must be user:password'),
        (['--page-auth-file', '{missing}'], {}, 'does not exist'),
    ],
)
def test_bad_combinations_of_page_options_are_usage_errors(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    (tmp_path / 'good').write_text('u:p\n')
    (tmp_path / 'bad').write_text('no colon here\n')
    paths = {'{file}': 'good', '{bad}': 'bad', '{missing}': 'missing'}
    result = cli(*(str(tmp_path / paths[a]) if a in paths else a for a in args), env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
