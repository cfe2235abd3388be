"""Following the primary: outage answers, prompt moves after a Sentinel failover.

A worker installs a :class:`PrimaryWatch` on its connection at start. It does three things,
all at the connection pool, so that every connection the worker and its work-horse use is
covered (RQ's own commands included):

* **Outage answers are connection errors.** ``NOREPLICAS``, ``READONLY``, ``LOADING``,
  ``MASTERDOWN``, ``TRYAGAIN`` and ``UNBLOCKED`` mean "this server cannot take writes now" (a
  primary that lost its replicas under ``min-replicas-to-write``, a demoted primary, a server
  loading its data, a blocking pop ended by a demotion). They are raised as
  :class:`~rq_epoch.errors.ServerOutageError`, a redis-py ``ConnectionError``, so the worker
  rides them out as it rides out a server that does not answer, and never quits or drops an
  outcome because of them.
* **A command does not hang on a frozen server.** In the worker process, a command that is
  not a blocking one (``BLMOVE``...) gets ``command_timeout`` seconds to answer rather than
  RQ's long socket timeout, so a primary that stopped answering is noticed within a
  heartbeat. The work-horse keeps RQ's socket timeout.
* **Following a failover (Sentinel only).** redis-py's Sentinel pool asks the sentinels for
  the primary's address only when it opens a connection; pooled connections keep talking to
  a demoted primary, which stays a writable master until the sentinels convert it (seconds
  later), and whatever is written there is lost at its resync. The watch asks the sentinels
  at most every ``interval`` seconds, just before a connection is handed out (at once after
  a connection error), and when the primary moved it closes the pool's idle connections and
  shuts down the sockets of those in use (the pubsub thread's), so that each reconnects to
  the new primary. A worker
  heartbeats once per interval, so its next heartbeat re-stamps its lease on the new
  primary. It logs one line per move: old and new address and run_id, and the worker loads
  its scripts there at once (a promoted replica has none in its cache).

The work-horse is a fork of the worker: it inherits the watch, and asks the sentinels right
before it records the job's outcome (:meth:`PrimaryWatch.refresh`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions

from ..adapters import redis_py
from ..errors import ServerOutageError

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['BLOCKING_COMMANDS', 'OUTAGE_CODES', 'PrimaryWatch', 'is_outage', 'is_sentinel_managed']

#: Error codes that mean "this server cannot take writes now": ride them out. The one list
#: of them (the take, the idle wait and the worker's start-up wait use it too). UNBLOCKED
#: ends a blocking pop when the primary becomes a replica.
OUTAGE_CODES = ('NOREPLICAS', 'READONLY', 'LOADING', 'MASTERDOWN', 'TRYAGAIN', 'UNBLOCKED')
_OUTAGE_RE = re.compile(r'(?:^|[\s:(-])(' + '|'.join(OUTAGE_CODES) + r')\b')
_OUTAGE_CLASSES: tuple[type[BaseException], ...] = tuple(
    cls
    for cls in (
        getattr(redis.exceptions, 'ReadOnlyError', None),
        getattr(redis.exceptions, 'BusyLoadingError', None),
        getattr(redis.exceptions, 'TryAgainError', None),
        getattr(redis.exceptions, 'MasterDownError', None),
    )
    if cls is not None
)

#: Commands that may wait on the server on purpose: they keep the pool's socket timeout.
BLOCKING_COMMANDS = frozenset(
    {
        'BLPOP',
        'BRPOP',
        'BLMOVE',
        'BRPOPLPUSH',
        'BLMPOP',
        'BZPOPMIN',
        'BZPOPMAX',
        'BZMPOP',
        'XREAD',
        'XREADGROUP',
        'WAIT',
        'WAITAOF',
        'DEBUG',
        'MONITOR',
        'SUBSCRIBE',
        'PSUBSCRIBE',
        'SSUBSCRIBE',
    }
)

logger = logging.getLogger('rq_epoch')


def is_outage(exc: BaseException) -> bool:
    """Whether a server error means "cannot take writes now" (see :data:`OUTAGE_CODES`)."""
    if isinstance(exc, (ServerOutageError, *_OUTAGE_CLASSES)):
        return True
    if not isinstance(exc, redis.exceptions.ResponseError):
        return False
    return _OUTAGE_RE.search(str(exc)) is not None


def is_sentinel_managed(connection: Redis) -> bool:
    """Whether the client's pool is redis-py's Sentinel pool for a primary (``Sentinel.master_for``)."""
    pool = getattr(connection, 'connection_pool', None)
    return bool(
        pool is not None
        and getattr(pool, 'is_master', False)
        and hasattr(pool, 'sentinel_manager')
        and hasattr(pool, 'service_name')
    )


def _command_name(args: tuple[Any, ...]) -> str:
    if not args:
        return ''
    name = args[0]
    if isinstance(name, bytes):
        name = name.decode('ascii', 'replace')
    return str(name).split(' ', 1)[0].upper()


class _WatchedConnection:
    """Mixed into the pool's connection class by :meth:`PrimaryWatch.install` (through
    :func:`rq_epoch.adapters.redis_py.hook_connections`)."""

    _rq_epoch_watch: PrimaryWatch
    _rq_epoch_blocking = False

    def send_command(self, *args: Any, **kwargs: Any) -> Any:
        self._rq_epoch_blocking = _command_name(args) in BLOCKING_COMMANDS
        return super().send_command(*args, **kwargs)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        watch = self._rq_epoch_watch
        blocking, self._rq_epoch_blocking = self._rq_epoch_blocking, False
        sock: socket.socket | None = None
        if (
            not blocking
            and watch.command_timeout is not None
            and 'timeout' not in kwargs
            and os.getpid() in watch.bounded_pids
        ):
            if watch.read_timeout_supported:
                kwargs['timeout'] = watch.command_timeout
            else:
                # A redis-py without a per-read timeout reads with the socket's own timeout:
                # bound this read on the socket itself, and give it back its own afterwards.
                sock = redis_py.socket_of(self)
                if sock is not None:
                    sock.settimeout(watch.command_timeout)
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            watch.expedite()
            raise
        except redis.exceptions.ResponseError as exc:
            if not is_outage(exc):
                raise
            watch.expedite()
            self.disconnect()  # type: ignore[attr-defined]
            raise ServerOutageError(str(exc)) from exc
        except redis.exceptions.RedisError:
            raise
        except BaseException:
            # Interrupted mid-read (a signal handler raised: RQ's warm shutdown, a job timeout).
            # The reply is still on its way: the connection must not be used again, and
            # redis-py's Sentinel connection does not drop it by itself.
            self.disconnect()  # type: ignore[attr-defined]
            raise
        finally:
            if sock is not None and sock is redis_py.socket_of(self):
                sock.settimeout(getattr(self, 'socket_timeout', None))


class PrimaryWatch:
    """Keeps a worker's connections on the current primary; see the module's docstring.

    ``interval``: seconds between questions to the sentinels. ``command_timeout``: seconds
    a non-blocking command may take in the worker process (None: the pool's socket
    timeout). ``sentinel_timeout``: socket timeout of the sentinel clients that have none.
    """

    def __init__(
        self,
        connection: Redis,
        *,
        interval: float,
        command_timeout: float | None = None,
        sentinel_timeout: float = 1.0,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        name: str = '',
        on_move: Callable[[], None] | None = None,
    ) -> None:
        self.connection = connection
        self.pool: Any = connection.connection_pool
        self.sentinel_managed = is_sentinel_managed(connection)
        self.interval = interval
        self.command_timeout = command_timeout
        self.sentinel_timeout = sentinel_timeout
        self.log = log or logger
        self.name = name
        #: Called after a move, on the new primary (the worker loads its scripts there).
        self.on_move = on_move
        #: The process that installed the watch (the worker, not its work-horse).
        self.pid = os.getpid()
        #: Processes whose non-blocking commands get ``command_timeout``: the worker only. A
        #: work-horse keeps RQ's socket timeout: its job's own commands may be slow, and an
        #: outcome in flight is fenced by the server wherever it lands.
        self.bounded_pids = {self.pid}
        #: The primary's address as last seen, and its run_id (when known).
        self.address: tuple[str, int] | None = None
        self.run_id: str | None = None
        #: ``time.monotonic()`` of the last move, and how many moves this process saw.
        self.moved_at: float | None = None
        self.moves = 0
        self.read_timeout_supported = True
        self._next_check = 0.0
        #: ``time.monotonic()`` of the last question to the sentinels.
        self.checked_at: float | None = None
        self._lock = threading.Lock()
        self._installed = False
        self._classes: dict[type, type] = {}

    # -- installing ------------------------------------------------------------------

    def install(self, run_id: str | None = None) -> PrimaryWatch:
        """Hook the watch into the connection's pool (once); ``run_id`` is the current primary's."""
        if self._installed:
            return self
        self._installed = True
        self.run_id = run_id
        pool = self.pool
        # Every connection of the pool, those opened before the watch included, gets the
        # watch's behaviour; the sentinels are asked (when due) before one is handed out.
        redis_py.hook_connections(pool, _WatchedConnection, self._watched_class, self.check)
        if self.sentinel_managed:
            for client in getattr(pool.sentinel_manager, 'sentinels', []):
                kwargs = client.connection_pool.connection_kwargs
                if kwargs.get('socket_timeout') is None:
                    kwargs['socket_timeout'] = self.sentinel_timeout
                if kwargs.get('socket_connect_timeout') is None:
                    kwargs['socket_connect_timeout'] = self.sentinel_timeout
            try:
                self.address = self._discover()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                self.address = None
            self._next_check = time.monotonic() + self.interval
        return self

    def _watched_class(self, base: type) -> type:
        cls = self._classes.get(base)
        if cls is None:
            cls = type(f'Watched{base.__name__}', (_WatchedConnection, base), {'_rq_epoch_watch': self})
            self._classes[base] = cls
            # redis-py before 5.0.2 has no per-read timeout (read_response bounds the socket then)
            self.read_timeout_supported = redis_py.reads_take_timeout(base)
        return cls

    # -- checking --------------------------------------------------------------------

    def expedite(self) -> None:
        """Ask the sentinels before the next connection is handed out (after a connection error)."""
        self._next_check = 0.0

    def refresh(self, max_age: float = 0.1) -> bool:
        """Ask the sentinels now unless that was done in the last ``max_age`` seconds.

        For the moment before an outcome is written: a work-horse whose job was short may
        not have asked since the failover. Returns True when the primary moved.
        """
        if self.checked_at is not None and time.monotonic() - self.checked_at < max_age:
            return False
        return self.check(force=True)

    def moved_recently(self, within: float) -> bool:
        """Whether this process moved to a new primary in the last ``within`` seconds."""
        return self.moved_at is not None and time.monotonic() - self.moved_at < within

    def _discover(self) -> tuple[str, int]:
        host, port = self.pool.get_master_address()
        return str(host), int(port)

    def check(self, force: bool = False) -> bool:
        """Ask the sentinels where the primary is, when due; move every connection if it moved.

        Returns True when the primary moved. Never raises for unreachable sentinels: the
        connections stay as they are and the next check is due after ``interval``.
        """
        if not self.sentinel_managed:
            return False
        now = time.monotonic()
        if not force and now < self._next_check:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._next_check = now + self.interval
            self.checked_at = now
            try:
                address = self._discover()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self.log.debug('Worker %s: could not ask the sentinels for the primary: %s', self.name, exc)
                return False
            if self.address is None or address == self.address:
                self.address = address
                return False
            old, self.address = self.address, address
            self.moved_at = time.monotonic()
            self.moves += 1
            # Idle connections were closed by the pool when it saw the new address. The ones
            # in use belong to other threads (the pubsub thread): shut their sockets down
            # without closing them, so that the thread reads an end of stream, reconnects
            # (through the sentinels, to the new primary) and subscribes again.
            self.pool.disconnect(inuse_connections=False)
            self._shut_down_in_use()
            old_run_id, self.run_id = self.run_id, self._read_run_id()
            if self.on_move is not None:
                try:
                    self.on_move()
                except redis.exceptions.RedisError as exc:
                    self.log.debug('Worker %s: after the move: %s', self.name, exc)
            level = logging.WARNING if os.getpid() == self.pid else logging.DEBUG
            self.log.log(
                level,
                'Worker %s: primary moved %s:%s (run_id %s) -> %s:%s (run_id %s); every connection follows it',
                self.name,
                old[0],
                old[1],
                old_run_id or 'unknown',
                address[0],
                address[1],
                self.run_id or 'unknown',
            )
            return True
        finally:
            self._lock.release()

    def _shut_down_in_use(self) -> None:
        for connection in redis_py.connections_in_use(self.pool):
            sock = redis_py.socket_of(connection)
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_run_id(self) -> str | None:
        try:
            return str(self.connection.info('server')['run_id'])
        except (redis.exceptions.RedisError, KeyError):
            return None

    def announced(self, run_id: str) -> bool:
        """Whether the last move was logged with this run_id (so the worker need not log it again)."""
        return self.moves > 0 and self.run_id == run_id
