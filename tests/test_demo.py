"""``rq-epoch demo`` as a user runs it: a subprocess, bounded in time, that leaves nothing behind."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rq_epoch import Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.pids import marked, send_signal
from tests.conftest import ROOT, wait_for

MARK = 'RQ_EPOCH_DEMO_TEST_MARK'
pytestmark = pytest.mark.skipif(not Path('/proc/self/environ').exists(), reason='finds leftovers through /proc')


def demo_command() -> list[str]:
    script = Path(sys.executable).with_name('rq-epoch')
    if script.exists():
        return [str(script), 'demo']
    return [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()', 'demo']


def demo_env(tmp: Path, mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
    env['TMPDIR'] = str(tmp)
    env[MARK] = mark
    return env


def processes_marked(mark: str) -> list[int]:
    """PIDs of live processes whose environment carries ``mark`` (the demo and all it started)."""
    return marked(MARK, mark)


def assert_nothing_left(tmp: Path, mark: str) -> None:
    wait_for(lambda: not processes_marked(mark), 10, what='every process of the demo to be gone')
    assert list(tmp.iterdir()) == [], 'the demo left files in its temp folder'


def kill_leftovers(mark: str) -> None:
    for pid in processes_marked(mark):
        send_signal(pid, signal.SIGKILL)


@pytest.fixture
def demo_tmp(tmp_path: Path) -> Path:
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    return tmp


@pytest.mark.slow
def test_demo_plays_both_stories_and_leaves_nothing_behind(demo_tmp: Path) -> None:
    mark = uuid.uuid4().hex
    started = time.monotonic()
    try:
        proc = subprocess.run(
            demo_command(), capture_output=True, text=True, env=demo_env(demo_tmp, mark), cwd='/', timeout=150
        )
    finally:
        leftovers = processes_marked(mark)
        kill_leftovers(mark)
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert elapsed < 120, f'the demo took {elapsed:.0f}s'
    assert leftovers == [], 'processes of the demo outlived it'

    epoch_ledger = out.split('Ledger (rq-epoch):', 1)[1].split('==', 1)[0]
    rows = {line.split()[0]: line for line in epoch_ledger.strip().splitlines()[1:] if line.strip()}
    assert set(rows) == {'h1', 'h2', 'pill', 'h3', 'h4', 'h5', 'h6'}
    for tag in ('h1', 'h2', 'h3', 'h4', 'h5', 'h6'):
        assert re.search(r'\bfinished\b', rows[tag]) and 'FAILED' not in rows[tag], rows[tag]
    assert 'recovered' in rows['h1']
    assert 'exempt' in rows['h4']
    assert 'dead-lettered (stalled 2/2)' in rows['pill']

    totals = re.search(r'healthy jobs failed\s+(\d+)\s+(\d+)', out)
    assert totals, out[-2000:]
    assert int(totals.group(1)) == 0
    assert int(totals.group(2)) > 0
    assert re.search(r'poison pill, rq-epoch: dead-lettered', out)
    assert 'server started again' in out
    assert_nothing_left(demo_tmp, mark)


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_removes_everything(demo_tmp: Path) -> None:
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        [*demo_command(), '--no-stock'],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=demo_env(demo_tmp, mark),
        cwd='/',
    )
    assert proc.stdout is not None
    out = b''
    try:
        # Interrupt while the server is down, with workers and work-horses running.
        deadline = time.monotonic() + 90
        while b'server stopped' not in out:
            assert time.monotonic() < deadline, out.decode(errors='replace')[-2000:]
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, out.decode(errors='replace')[-2000:]
                out += chunk
        assert len(processes_marked(mark)) > 3
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        out += rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        leftovers = processes_marked(mark)
        kill_leftovers(mark)
    text = out.decode(errors='replace')
    assert proc.returncode == 130, text[-2000:]
    assert 'interrupted: stopped' in text
    assert 'Traceback' not in text
    assert leftovers == []
    assert_nothing_left(demo_tmp, mark)


@pytest.mark.slow
def test_demo_against_a_given_server_skips_the_restart_and_removes_its_keys(demo_tmp: Path) -> None:
    from tests.test_cli import snapshot

    mark = uuid.uuid4().hex
    with EmbeddedServer('valkey') as server:
        conn = server.client()
        Queue('users-own', connection=conn).enqueue('tests.jobs.add', 1, 2)
        run_id = conn.info('server')['run_id']
        before = snapshot(conn)
        try:
            proc = subprocess.run(
                [*demo_command(), '--url', server.url, '--no-stock'],
                capture_output=True,
                text=True,
                env=demo_env(demo_tmp, mark),
                cwd='/',
                timeout=90,
            )
        finally:
            leftovers = processes_marked(mark)
            kill_leftovers(mark)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert 'it will not be restarted' in proc.stdout
        assert 'Act 3: the server restarts mid-run -- skipped' in proc.stdout
        assert 'dead-lettered (stalled 2/2)' in proc.stdout
        assert conn.info('server')['run_id'] == run_id
        # RQ's workers take a global maintenance lock (rq:clean_groups, with a TTL); nothing else may remain.
        after = {key: value for key, value in snapshot(conn).items() if not key.startswith(b'rq:clean_')}
        assert after == before
        assert leftovers == []

        # A server user that may not run INFO: one line, exit status 1.
        conn.execute_command('ACL', 'SETUSER', 'noinfo', 'on', '>pw', '~*', '&*', '+@all', '-info')
        refused = subprocess.run(
            [*demo_command(), '--url', f'redis://noinfo:pw@127.0.0.1:{server.port}/0'],
            capture_output=True,
            text=True,
            env=demo_env(demo_tmp, mark),
            timeout=60,
        )
        assert refused.returncode == 1
        assert refused.stderr.startswith('Error: ') and 'INFO' in refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        conn.close()
        server.kill(signal.SIGTERM)
    assert_nothing_left(demo_tmp, mark)


def test_demo_against_an_unreachable_server_is_exit_1(demo_tmp: Path) -> None:
    from rq_epoch.embedded import free_port

    mark = uuid.uuid4().hex
    closed = subprocess.run(
        [*demo_command(), '--url', f'redis://127.0.0.1:{free_port()}/0'],
        capture_output=True,
        text=True,
        env=demo_env(demo_tmp, mark),
        timeout=60,
    )
    assert closed.returncode == 1
    assert closed.stderr.startswith('Error: cannot reach the server') and 'Traceback' not in closed.stderr
    assert len(closed.stderr.splitlines()) == 1
    assert_nothing_left(demo_tmp, mark)
