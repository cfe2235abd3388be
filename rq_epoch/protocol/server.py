"""The server a sweep or a worker talks to: its epoch (run_id) and its role as primary.

Read-only helpers for start-up checks and status views; the scripts apply the same rules
in the server (``lua/_epoch.lua``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError, ResponseError

from ..compat import text
from ..errors import EpochUnavailableError
from . import epoch, keys

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['REPLICA_MAX_LAG', 'PrimaryState', 'ServerEpoch', 'primary_state', 'read_epoch', 'read_primary_state']


@dataclass(frozen=True)
class ServerEpoch:
    """The server process the sweep talks to: its run_id, uptime and role."""

    run_id: str
    uptime: int
    role: str = ''


def read_epoch(connection: Redis, *, with_role: bool = True) -> ServerEpoch:
    """Read the current epoch with INFO server, for start-up checks and status views.

    ``with_role=False`` skips the extra INFO replication round trip (the sweep needs no role).

    Raises:
        EpochUnavailableError: INFO is refused (ACL) or has no valid run_id.
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
