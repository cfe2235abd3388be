"""Loads the server-side scripts once and calls them by SHA.

Each verb lives in its own file under ``rq_epoch/protocol/lua/``; a line
``-- @include NAME`` pastes a helper file. Scripts are called with EVALSHA and reloaded
when the server answers NOSCRIPT (as it does after every restart). On a pipeline the
EVALSHA is queued directly, so a script adds no round trip of its own (a redis-py
``Script`` object would send SCRIPT EXISTS first).

This module only loads and sends; a script's reply is read by its typed wrapper in
:mod:`rq_epoch.protocol.verbs`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, NoReturn

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from ..errors import EpochUnavailableError

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

__all__ = [
    'EPOCH_UNAVAILABLE',
    'ServerScript',
    'claim',
    'commit',
    'confirm',
    'extend',
    'grant',
    'handback',
    'raise_typed',
    'rescue',
    'stopmark',
    'sweep',
    'take',
    'ticket',
    'watch',
]

EPOCH_UNAVAILABLE = 'EPOCH_UNAVAILABLE'


def _read(name: str) -> str:
    return resources.files('rq_epoch.protocol').joinpath('lua').joinpath(name).read_text(encoding='utf-8')


def _expand(text: str) -> str:
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('-- @include '):
            lines.append(_expand(_read(stripped[len('-- @include ') :].strip())))
        else:
            lines.append(line)
    return '\n'.join(lines) + '\n'


def raise_typed(exc: ResponseError) -> NoReturn:
    """Re-raise a server error from a script as rq-epoch's typed error where one applies."""
    text = str(exc)
    if EPOCH_UNAVAILABLE in text:
        detail = text.split(EPOCH_UNAVAILABLE, 1)[1].strip()
        raise EpochUnavailableError(f'the server did not yield a valid run_id: {detail}') from exc
    if isinstance(exc, NoPermissionError) or text.startswith('NOPERM'):
        raise EpochUnavailableError(f'the server refused an rq-epoch script: {text}') from exc
    raise exc


@dataclass(frozen=True)
class ServerScript:
    """One server-side verb: its source (helpers pasted in) and its SHA1.

    Built with :meth:`read`, which hashes the source once per process, when the script is
    first needed: a worker loads every script at start, so its work-horses (forks of it)
    call them by SHA without hashing the source for each job.
    """

    name: str
    source: str
    sha: str

    @classmethod
    def read(cls, name: str) -> ServerScript:
        """The script ``lua/<name>.lua``, its helpers pasted in."""
        source = _expand(_read(f'{name}.lua'))
        return cls(name, source, hashlib.sha1(source.encode('utf-8')).hexdigest())

    def load(self, connection: Redis) -> None:
        """Load the script into the server's script cache."""
        try:
            connection.script_load(self.source)
        except ResponseError as exc:
            raise_typed(exc)

    def __call__(self, connection: Redis, keys: list[str], args: list[Any]) -> Any:
        """Run the script now, loading it first if the server does not know it."""
        try:
            try:
                return connection.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                self.load(connection)
                return connection.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            raise_typed(exc)

    def queue(self, pipeline: Pipeline, keys: list[str], args: list[Any]) -> None:
        """Queue an EVALSHA on ``pipeline``; the caller handles NOSCRIPT from ``execute()``."""
        pipeline.execute_command('EVALSHA', self.sha, len(keys), *keys, *args)


@cache
def _script(name: str) -> ServerScript:
    return ServerScript.read(name)


def _verb(name: str) -> Callable[[], ServerScript]:
    """The accessor of one verb's script (read, expanded and hashed once per process)."""

    def script() -> ServerScript:
        return _script(name)

    script.__name__ = script.__qualname__ = name
    script.__doc__ = f'The ``{name}`` script (``lua/{name}.lua``).'
    return script


grant = _verb('grant')
extend = _verb('extend')
sweep = _verb('sweep')
rescue = _verb('rescue')
claim = _verb('claim')
commit = _verb('commit')
take = _verb('take')
watch = _verb('watch')
ticket = _verb('ticket')
stopmark = _verb('stopmark')
handback = _verb('handback')
confirm = _verb('confirm')


def load_all(connection: Redis) -> None:
    """Load every script (a worker does this at start and after the server returns)."""
    for script in (
        grant(),
        extend(),
        sweep(),
        rescue(),
        claim(),
        commit(),
        take(),
        watch(),
        ticket(),
        stopmark(),
        handback(),
        confirm(),
    ):
        script.load(connection)
