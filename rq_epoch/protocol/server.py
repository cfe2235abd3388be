"""The server a sweep or a worker talks to: its version, its epoch (run_id) and its role as primary.

Read-only helpers for start-up checks and status views; the scripts apply the same rules
in the server (``lua/_epoch.lua``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError, ResponseError

from ..compat import text
from ..errors import EpochUnavailableError, UnsupportedServerError
from . import epoch, keys

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    'MINIMUM_REDIS_VERSION',
    'REPLICA_MAX_LAG',
    'PrimaryState',
    'ServerEpoch',
    'ServerVersion',
    'check_server_version',
    'primary_state',
    'read_epoch',
    'read_primary_state',
    'read_server_version',
    'server_version',
]

#: The oldest Redis rq-epoch runs on. Redis 6.2 brought ``LMOVE`` and ``BLMOVE``, with which RQ
#: takes a job from a single queue into its intermediate list (and which rq-epoch relies on).
#: Every Valkey is newer: Valkey reports ``redis_version:7.2.4``, the Redis it is compatible with.
MINIMUM_REDIS_VERSION = (6, 2, 0)

_VERSION = re.compile(r'(\d+)\.(\d+)(?:\.(\d+))?')


@dataclass(frozen=True)
class ServerVersion:
    """The server software as ``INFO server`` names it."""

    #: ``Redis``, or ``Valkey`` when the server reports a ``valkey_version``.
    name: str
    #: Its own version, as reported (``6.2.14``; ``8.1.1`` for Valkey 8.1.1).
    version: str
    #: The Redis version it answers as (``redis_version``: Valkey's is ``7.2.4``): what rq-epoch
    #: needs is judged on it.
    redis_version: tuple[int, int, int]

    def __str__(self) -> str:
        return f'{self.name} {self.version}'

    @property
    def supported(self) -> bool:
        """Whether rq-epoch runs on this server (Redis 6.2 or later, any Valkey)."""
        return self.redis_version >= MINIMUM_REDIS_VERSION


def _version_numbers(value: Any) -> tuple[int, int, int] | None:
    match = _VERSION.match(str(value)) if value is not None else None
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def server_version(info: Mapping[str, Any]) -> ServerVersion | None:
    """The server's name and version from a parsed ``INFO server`` reply; None if it names none.

    Redis reports ``redis_version``; Valkey reports ``valkey_version`` (its own) and
    ``redis_version`` 7.2.4 (the Redis it is compatible with).
    """
    numbers = _version_numbers(info.get('redis_version'))
    if numbers is None:
        return None
    valkey = info.get('valkey_version')
    if valkey is not None:
        return ServerVersion('Valkey', str(valkey), numbers)
    return ServerVersion('Redis', str(info['redis_version']), numbers)


def check_server_version(info: Mapping[str, Any]) -> ServerVersion | None:
    """Refuse a server older than rq-epoch needs, from its parsed ``INFO server`` reply.

    A reply without a version (no ``redis_version``, or not ``X.Y[.Z]``) is not refused:
    nothing tells it is too old, and the run_id's shape check still applies.

    Raises:
        UnsupportedServerError: Redis before 6.2 (no ``BLMOVE``).
    """
    version = server_version(info)
    if version is not None and not version.supported:
        needed = '.'.join(str(n) for n in MINIMUM_REDIS_VERSION[:2])
        raise UnsupportedServerError(str(version), f'Redis {needed} or later, or Valkey')
    return version


@dataclass(frozen=True)
class ServerEpoch:
    """The server process the sweep talks to: its run_id, uptime and role."""

    run_id: str
    uptime: int
    role: str = ''


def read_server_version(connection: Redis) -> ServerVersion | None:
    """Read the server's version with INFO server, refused when older than rq-epoch needs.

    For a start that does not need the epoch itself (``rq-epoch worker`` before RQ's worker
    starts, whatever its class). None when INFO is refused (the epoch check says so where the
    epoch is needed) or names no version.

    Raises:
        UnsupportedServerError: the server is Redis before 6.2.
    """
    try:
        info = connection.info('server')
    except ResponseError as exc:
        if isinstance(exc, NoPermissionError) or str(exc).startswith('NOPERM'):
            return None
        raise
    return check_server_version(info)


def read_epoch(connection: Redis, *, with_role: bool = True) -> ServerEpoch:
    """Read the current epoch with INFO server, for start-up checks and status views.

    ``with_role=False`` skips the extra INFO replication round trip (the sweep needs no role).
    The same reply says which server it is: one older than rq-epoch needs is refused here
    (:func:`check_server_version`), before anything is written.

    Raises:
        EpochUnavailableError: INFO is refused (ACL) or has no valid run_id.
        UnsupportedServerError: the server is Redis before 6.2.
    """
    try:
        info = connection.info('server')
    except ResponseError as exc:
        if isinstance(exc, NoPermissionError) or str(exc).startswith('NOPERM'):
            raise EpochUnavailableError(
                'the server user may not run INFO (grant it with the ACL rule +info); '
                f'rq-epoch needs INFO server to read the run_id: {exc}'
            ) from exc
        raise
    check_server_version(info)
    run_id = info.get('run_id')
    if not epoch.is_valid_run_id(str(run_id) if run_id is not None else None):
        raise EpochUnavailableError(
            f'INFO server answered without a valid run_id ({run_id!r}); rq-epoch needs the '
            '40-character run_id of the server process (is a proxy hiding it?)'
        )
    role = ''
    if with_role:
        try:
            role = str(connection.info('replication').get('role', ''))
        except ResponseError:
            pass
    return ServerEpoch(run_id=str(run_id), uptime=int(info.get('uptime_in_seconds', 0)), role=role)


@dataclass(frozen=True)
class PrimaryState:
    """What the sweep script saw of the server's role, as recorded in ``<prefix>:epoch:primaries``."""

    #: INFO replication ``role``: ``master`` for a primary, ``slave`` for a replica.
    role: str = ''
    #: Seconds this server process has been serving the dataset as primary (restart or
    #: promotion), by the server clock; 0 when this sweep was the first to see it.
    age: float = 0.0
    #: Server time at which a script first saw this process as primary (0: not recorded yet).
    first_seen: float = 0.0
    #: Replicas connected and online now.
    replicas_online: int = 0
    #: Most replicas seen online while this process has been primary.
    replicas_expected: int = 0

    @property
    def is_primary(self) -> bool:
        return self.role == 'master'

    @property
    def isolated(self) -> bool:
        """A primary that had replicas in its epoch and has none online now (demoted or cut off)."""
        return self.is_primary and self.replicas_expected > 0 and self.replicas_online == 0

    @property
    def judges(self) -> bool:
        """Whether a sweep on this server gives verdicts: a primary that is not isolated."""
        return self.is_primary and not self.isolated

    @property
    def state(self) -> str:
        """``primary``, ``isolated`` or ``replica`` (any role other than master)."""
        if not self.is_primary:
            return 'replica'
        return 'isolated' if self.isolated else 'primary'


#: A replica whose last acknowledgement is older than this is not counted online (seconds).
REPLICA_MAX_LAG = 10


def read_primary_state(connection: Redis, current: ServerEpoch | None = None) -> PrimaryState:
    """The server's role and primary epoch as the sweep script would see them; writes nothing.

    For status views: the same rule as ``primary_epoch`` in ``lua/_epoch.lua``, read
    from INFO replication and ``<prefix>:epoch:primaries`` with the server clock.
    """
    current = current or read_epoch(connection, with_role=False)
    with connection.pipeline(transaction=False) as pipeline:
        pipeline.info('replication')
        pipeline.hgetall(keys.primaries_key())
        pipeline.time()
        info, entries, (seconds, micros) = pipeline.execute()
    return primary_state(current, info, entries, float(seconds) + float(micros) / 1e6)


def primary_state(current: ServerEpoch, info: dict[str, Any], entries: dict[Any, Any], now: float) -> PrimaryState:
    """:class:`PrimaryState` from replies already read: INFO replication, HGETALL of
    ``<prefix>:epoch:primaries`` and the server TIME (``now``, seconds)."""
    role = str(info.get('role', ''))
    if role != 'master':
        return PrimaryState(role=role)
    online = 0
    for name, value in info.items():
        if str(name).startswith('slave') and isinstance(value, dict):
            if value.get('state') == 'online' and int(value.get('lag', 0) or 0) <= REPLICA_MAX_LAG:
                online += 1
    field_name = f'{current.run_id}:{info.get("master_replid", "")}'
    entry = next((value for name, value in entries.items() if text(name) == field_name), None)
    first, expected = 0.0, 0
    if entry:
        try:
            first_text, expected_text = text(entry).split(' ', 1)
            first, expected = float(first_text), int(expected_text)
        except ValueError:
            first, expected = 0.0, 0
    expected = max(expected, online)
    age = max(0.0, min(float(current.uptime), now - first)) if first else 0.0
    return PrimaryState(role=role, age=age, first_seen=first, replicas_online=online, replicas_expected=expected)
