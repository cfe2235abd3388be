"""Confirming writes: replicas (``WAIT``) and, on request, the primary's disk (``WAITAOF``).

A write that a primary acknowledged is lost if the primary is replaced before its replicas
received it (a failover after a freeze, a network cut, a crash). With
``RQ_EPOCH_DURABLE_REPLICAS`` (and ``RQ_EPOCH_DURABLE_FSYNC``), a worker asks the server to
confirm its grant and its outcome, and :class:`rq_epoch.Queue` a job it enqueued, before they
count as written (see ``docs/restarts-and-failovers.md``, "Durable outcomes").

``WAIT`` confirms the writes made *on the connection that sends it*. A worker's writes go
over pooled connections, so each confirmation first writes a key of its own
(:func:`rq_epoch.protocol.keys.confirm_key`) on the connection it then waits on: the
replication stream is one ordered stream, so a replica that has that write has every write
the primary applied before it. The write, ``WAIT`` and ``WAITAOF`` go in one round trip.

Where the setting cannot work, :class:`Durability` says so once and goes on as without it:
no replica connected, none seen on that server process by this process for
:data:`ALONE_AFTER` seconds, and the server not promoted from a replica in the last
:data:`ALONE_AFTER` seconds (one line, again each time they all went away; a primary that lost
its replicas a moment ago may have been replaced, and one promoted a moment ago has its old
primary on its way back as its replica, so the worker keeps waiting and following the primary
until then), ``WAIT`` or ``WAITAOF``
refused by an ACL (one warning), a server without ``WAITAOF`` (before Redis 7.2 and Valkey
8) or without an append-only file (one warning, replicas are still asked).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import redis.exceptions

from . import keys, scripts, verbs

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['Confirmation', 'Durability']

logger = logging.getLogger('rq_epoch')

#: Seconds a server process must have had no replica, as far as this process saw, before
#: writes count as written without one. A primary that a failover just replaced (or a network cut off) has
#: lost its replicas too: for that long, the worker keeps waiting and following the primary.
ALONE_AFTER = 60.0


class _Sightings:
    """What this process saw of each server's replicas, shared by every :class:`Durability` in
    it (a producer may make a new queue for each job), by server process (run_id): when it last
    saw one connected, and whether it said it saw none."""

    seen: ClassVar[dict[str, float]] = {}
    alone: ClassVar[set[str]] = set()

    @classmethod
    def saw(cls, run_id: str) -> None:
        cls.seen[run_id] = time.monotonic()
        cls.alone.discard(run_id)
        if len(cls.seen) > 64:  # servers this process no longer talks to
            oldest = min(cls.seen, key=cls.seen.__getitem__)
            del cls.seen[oldest]

    @classmethod
    def lately(cls, run_id: str) -> bool:
        seen = cls.seen.get(run_id)
        return seen is not None and time.monotonic() - seen < ALONE_AFTER


#: Milliseconds the confirmation key lives (only so that it does not stay forever).
_CONFIRM_KEY_TTL_MS = 600_000


@dataclass(frozen=True)
class Confirmation:
    """What the server confirmed of the writes made before it."""

    #: The writes count as written: enough replicas (and the disk, if asked) confirmed them,
    #: or the setting cannot work on this server (``degraded``).
    confirmed: bool
    #: Replicas that confirmed (``WAIT``'s reply); None when not asked.
    replicas: int | None = None
    #: Whether the primary fsynced them (``WAITAOF``); None when not asked.
    fsynced: bool | None = None
    #: Replicas connected to the primary, read when too few confirmed; None when not read.
    connected: int | None = None
    #: Counted as written without a confirmation: no replica connected, or the server refused.
    degraded: bool = False
    #: The server that confirmed, ``<run_id>:<master_replid>`` ('' when nothing was asked).
    server: str = ''
    #: What the fence's check (``check`` of :meth:`Durability.confirm`) found on that server;
    #: None when none was asked or it could not run.
    check: verbs.CommitReply | None = None


class Durability:
    """Confirms writes as ``RQ_EPOCH_DURABLE_*`` asks; see the module's docstring.

    ``replicas``: replicas that must confirm (0: none asked). ``timeout_ms``: how long one
    confirmation waits for them. ``fsync``: also ask the primary to confirm its append-only
    file has them on disk. ``log`` and ``name`` are for the one-line reports.
    """

    def __init__(
        self,
        replicas: int,
        timeout_ms: int,
        fsync: bool = False,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        name: str = '',
    ) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.fsync = fsync
        self.log = log or logger
        self.name = name
        self._lock = threading.Lock()
        self._wait_refused = False
        self._waitaof_refused = False

    @property
    def enabled(self) -> bool:
        """Whether anything is asked at all (a replica count, or the disk)."""
        return (self.replicas > 0 and not self._wait_refused) or (self.fsync and not self._waitaof_refused)

    def _who(self) -> str:
        return f'Worker {self.name}: ' if self.name else ''

    def confirm(self, connection: Redis, check: tuple[list[str], list[Any]] | None = None) -> Confirmation:
        """Ask the server to confirm every write it applied so far: one round trip (the
        ``confirm`` script, ``WAIT``, ``WAITAOF``).

        ``check``: KEYS and ARGV of a ``commit`` script call in check-only mode (an
        execution's fence, see :meth:`rq_epoch.worker.fence.Fence.check`), sent last in the
        same round trip, so on the same server as the confirmation: whether the write to
        confirm is on *this* server at all (the connection may have reached a new primary by
        itself since the write). Its reply is :attr:`Confirmation.check`.

        Raises redis-py's connection errors as they come (the caller rides them out).
        """
        if not self.enabled:
            return Confirmation(confirmed=True)
        ask_replicas = self.replicas > 0 and not self._wait_refused
        ask_disk = self.fsync and not self._waitaof_refused
        for _ in range(2):
            with connection.pipeline(transaction=False) as pipeline:
                scripts.confirm().queue(
                    pipeline, [keys.confirm_key(), keys.primaries_key()], [_CONFIRM_KEY_TTL_MS, int(ALONE_AFTER)]
                )
                if ask_replicas:
                    pipeline.execute_command('WAIT', self.replicas, self.timeout_ms)
                if ask_disk:
                    pipeline.execute_command('WAITAOF', 1, 0, self.timeout_ms)
                if check is not None:
                    scripts.commit().queue(pipeline, *check)
                replies = pipeline.execute(raise_on_error=False)
            if not isinstance(replies[0], redis.exceptions.NoScriptError):
                break
            scripts.load_all(connection)  # the server restarted since: nothing was confirmed
        first = replies[0]
        if isinstance(first, redis.exceptions.NoPermissionError) or 'NOPERM' in str(first):
            self._refused('EVALSHA', first)  # an ACL without the script: nothing can be confirmed
            return Confirmation(confirmed=True, degraded=True)
        if isinstance(first, Exception):
            if isinstance(first, redis.exceptions.ResponseError):
                scripts.raise_typed(first)  # EPOCH_UNAVAILABLE (INFO refused), or another error
            raise first  # the write itself was refused (an outage): nothing to confirm
        written = verbs.ConfirmReply.read(first)
        server, connected = written.server, written.connected
        checked: verbs.CommitReply | None = None
        if check is not None and not isinstance(replies[-1], Exception):
            checked = verbs.CommitReply.read(replies[-1])
        index = 1
        acked: int | None = None
        fsynced: bool | None = None
        if ask_replicas:
            reply = replies[index]
            index += 1
            if isinstance(reply, redis.exceptions.ResponseError):
                self._refused('WAIT', reply)
            else:
                acked = int(reply)
        if ask_disk:
            reply = replies[index]
            if isinstance(reply, redis.exceptions.ResponseError):
                self._refused('WAITAOF', reply)
            else:
                fsynced = int(reply[0]) >= 1
        run_id = server.split(':', 1)[0]
        if connected or acked:
            _Sightings.saw(run_id)

        def result(confirmed: bool, degraded: bool = False) -> Confirmation:
            return Confirmation(
                confirmed=confirmed,
                replicas=acked,
                fsynced=fsynced,
                connected=connected,
                degraded=degraded,
                server=server,
                check=checked,
            )

        if fsynced is False:
            return result(False)
        if acked is None or acked >= self.replicas:
            return result(True)
        if connected == 0:
            if _Sightings.lately(run_id) or not written.settled:
                # This server had replicas a moment ago: it may just have been replaced (a
                # promoted replica leaves its old primary alone), or cut off; or it was itself
                # promoted a moment ago, and its old primary may be on its way back as its
                # replica (or another failover may take it over). Not confirmed.
                return result(False)
            if run_id not in _Sightings.alone:
                _Sightings.alone.add(run_id)
                self.log.warning(
                    '%sno replica is connected to the primary: grants, outcomes and enqueues are not '
                    'confirmed by a replica until one is (RQ_EPOCH_DURABLE_REPLICAS=%d)',
                    self._who(),
                    self.replicas,
                )
            return result(True, degraded=True)
        # Fewer replicas than asked are connected: confirmed, degraded, when every one of them did.
        return result(acked >= connected, degraded=acked >= connected)

    def _refused(self, command: str, error: redis.exceptions.ResponseError) -> None:
        """The server refused ``WAIT`` or ``WAITAOF`` (an ACL, an old server, no AOF): say so once."""
        with self._lock:
            if command == 'EVALSHA':
                self._wait_refused = self._waitaof_refused = True
                consequence = 'grants, outcomes and enqueues are not confirmed at all'
            elif command == 'WAIT':
                self._wait_refused = True
                consequence = 'grants, outcomes and enqueues are not confirmed by replicas'
            else:
                self._waitaof_refused = True
                consequence = "they are not confirmed on the primary's disk"
        self.log.warning('%sthe server refused %s (%s): %s', self._who(), command, error, consequence)
