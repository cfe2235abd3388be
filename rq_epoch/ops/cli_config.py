"""What every ``rq-epoch`` command shares: RQ's connection options, read with RQ's CLI helpers,
and the way server errors end a command (one line on stderr, exit status 1)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import update_wrapper
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import redis
from rq.cli.helpers import get_redis_from_config, read_config_file
from rq.defaults import DEFAULT_CONNECTION_CLASS, DEFAULT_SERIALIZER_CLASS
from rq.serializers import resolve_serializer
from rq.utils import import_attribute

from ..errors import ConfigurationError, RqEpochError
from ..jobs.job import Job
from ..jobs.jobclass import epoch_job_class
from ..protocol import keys
from .formatting import one_line
from .status import all_queue_names

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['CliConfig', 'fail', 'pass_cli_config', 'server_errors']

F = TypeVar('F', bound=Callable[..., Any])


def fail(message: str, status: int = 1) -> NoReturn:
    """Print a one-line error on stderr and exit with ``status`` (1 unless said otherwise)."""
    click.echo(f'Error: {one_line(message)}', err=True)
    sys.exit(status)


class CliConfig:
    """The options every command shares, turned into a connection, a job class and a serializer.

    The connection follows ``rq``'s CLI: ``--url``, else the ``--config`` module's
    ``REDIS_URL`` / ``SENTINEL`` / ``REDIS_HOST``... settings, else the same settings
    from the environment.
    """

    def __init__(
        self,
        url: str | None = None,
        config: str | None = None,
        job_class: str = 'rq_epoch.Job',
        connection_class: str = DEFAULT_CONNECTION_CLASS,
        path: Sequence[str] = ('.',),
        serializer: str = DEFAULT_SERIALIZER_CLASS,
        queues: Sequence[str] = (),
        all_queues: bool = False,
    ) -> None:
        self.names = list(dict.fromkeys(queues))
        self.all_queues = all_queues
        if self.names and all_queues:
            raise click.UsageError('give queue names or --all, not both')
        for entry in path or ():
            if entry not in sys.path:
                sys.path.append(entry)
        self.url = url
        self.config = config
        self.settings: dict[str, Any] = {}
        if config:
            try:
                self.settings = read_config_file(config)
            except Exception as exc:  # noqa: BLE001 - any import failure is a usage error
                raise click.BadParameter(f'cannot import {config!r}: {one_line(exc)}', param_hint='--config') from exc
        try:
            self.connection_class: type[Redis] = import_attribute(connection_class)  # type: ignore[assignment]
        except Exception as exc:  # noqa: BLE001
            raise click.BadParameter(one_line(exc), param_hint='--connection-class') from exc
        self.job_class = _resolve_job_class(job_class)
        try:
            self.serializer = resolve_serializer(serializer)
        except Exception as exc:  # noqa: BLE001
            raise click.BadParameter(one_line(exc), param_hint='--serializer') from exc
        self._connection: Redis | None = None

    @property
    def connection(self) -> Redis:
        """The client, made on first use."""
        if self._connection is None:
            try:
                if self.url:
                    self._connection = self.connection_class.from_url(self.url)
                elif self.config:
                    self._connection = get_redis_from_config(self.settings, self.connection_class)
                else:
                    self._connection = get_redis_from_config(os.environ, self.connection_class)
            except ValueError as exc:
                hint = '--url' if self.url else ('--config' if self.config else 'REDIS_* environment')
                raise click.BadParameter(one_line(exc), param_hint=hint) from exc
        return self._connection

    def describe(self) -> str:
        """Where the connection goes, without credentials, for error messages."""
        connection = self._connection
        if connection is None:
            return 'the server'
        kwargs = connection.connection_pool.connection_kwargs
        if 'path' in kwargs:
            return f'unix://{kwargs["path"]}'
        service = getattr(connection.connection_pool, 'service_name', None)
        if service:
            return f'the master {service!r} of the sentinels'
        return f'{kwargs.get("host", "localhost")}:{kwargs.get("port", 6379)}/{kwargs.get("db", 0)}'

    def queue_names(self) -> list[str]:
        """The queues chosen by ``--queue``/arguments, ``--all``, or the config module's ``QUEUES``."""
        if self.all_queues:
            return all_queue_names(self.connection)
        if not self.names and self.settings.get('QUEUES'):
            return list(dict.fromkeys(self.settings['QUEUES']))
        return list(self.names)


def _resolve_job_class(name: str) -> type[Job]:
    try:
        return epoch_job_class(name)
    except ConfigurationError as exc:
        raise click.BadParameter(one_line(exc), param_hint='--job-class') from exc


_shared_options = [
    click.option('--url', '-u', envvar='RQ_REDIS_URL', help='URL describing Redis connection details.'),
    click.option('--config', '-c', envvar='RQ_CONFIG', help='Module containing RQ settings.'),
    click.option(
        '--job-class',
        '-j',
        envvar='RQ_JOB_CLASS',
        default='rq_epoch.Job',
        show_default=True,
        help='Job class (derived from rq.job.Job; it is given the epoch behaviour).',
    ),
    click.option(
        '--connection-class',
        envvar='RQ_CONNECTION_CLASS',
        default=DEFAULT_CONNECTION_CLASS,
        help='Redis client class to use.',
    ),
    click.option('--path', '-P', default=['.'], multiple=True, help='Specify the import path.'),
    click.option(
        '--serializer',
        '-S',
        default=DEFAULT_SERIALIZER_CLASS,
        help='Serializer to use. Accepts json, pickle, or a dotted import path.',
    ),
    click.option('--queue', '-q', 'queue_options', multiple=True, metavar='NAME', help='A queue (repeatable).'),
    click.option('--all', '-a', 'all_queues', is_flag=True, help=f'Every queue in {keys.queues_key()}.'),
    click.argument('queues', nargs=-1),
]


def pass_cli_config(func: F) -> F:
    """Add the shared options to a command and pass it a :class:`CliConfig` first."""
    for option in reversed(_shared_options):
        func = option(func)

    def wrapper(**kwargs: Any) -> Any:
        cli_config = CliConfig(
            url=kwargs.pop('url'),
            config=kwargs.pop('config'),
            job_class=kwargs.pop('job_class'),
            connection_class=kwargs.pop('connection_class'),
            path=kwargs.pop('path'),
            serializer=kwargs.pop('serializer'),
            queues=[*kwargs.pop('queue_options'), *kwargs.pop('queues')],
            all_queues=kwargs.pop('all_queues'),
        )
        return func(cli_config, **kwargs)

    return update_wrapper(wrapper, func)  # type: ignore[return-value]


@contextmanager
def server_errors(cli_config: CliConfig) -> Iterator[None]:
    """Turn an unreachable server or a refused command into a one-line error and exit status 1."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        fail(f'cannot reach {cli_config.describe()}: {exc}')
    except RqEpochError as exc:
        fail(str(exc))
    except redis.exceptions.ResponseError as exc:
        fail(f'{cli_config.describe()} refused a command: {exc}')
    except redis.exceptions.RedisError as exc:
        fail(f'{cli_config.describe()}: {exc}')
