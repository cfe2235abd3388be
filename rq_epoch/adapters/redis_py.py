"""redis-py's internals that rq-epoch relies on (see :mod:`rq_epoch.adapters` for the rule).

Two mechanisms need them, and redis-py has no public hook for either:

* **The fenced commit** (:mod:`rq_epoch.worker.fence`). RQ records an outcome as one
  transaction on a redis-py pipeline and sends it with ``pipeline.execute()``. The fence
  takes the place of that ``execute()`` on the one pipeline (:func:`intercept_execute`),
  reads and rewrites the queued commands (:class:`QueuedTransaction`) so that they travel
  inside the commit script, and keeps a note on the pipeline across RQ's retries
  (:func:`note`, :func:`noted`).
* **The failover watch** (:mod:`rq_epoch.worker.failover`). A worker gets its connection
  made by the user or by RQ's command line; the watch gives every connection of that
  client's pool, the ones already open included, a mixin over ``send_command`` and
  ``read_response`` (:func:`hook_connections`, :func:`unhooked_connection_class`), bounds
  a read on the socket where redis-py has no per-read timeout (:func:`reads_take_timeout`,
  :func:`socket_of`), and shuts down the sockets of connections in use when the primary
  moves (:func:`connections_in_use`).

Nothing here sends a command of its own: each function is the one attribute access or
assignment it names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import socket

    from redis.client import Pipeline
    from redis.connection import ConnectionPool

__all__ = [
    'ExecuteHandler',
    'QueuedCommand',
    'QueuedTransaction',
    'connections_in_use',
    'hook_connections',
    'intercept_execute',
    'note',
    'noted',
    'reads_take_timeout',
    'socket_of',
    'unhooked_connection_class',
]

#: A command queued on a pipeline, as redis-py keeps it: its arguments (the name first) and
#: the options its response callback is given.
QueuedCommand = tuple[tuple[Any, ...], dict[str, Any]]

H = TypeVar('H', bound='ExecuteHandler')

# -- the fenced commit ------------------------------------------------------------------


class QueuedTransaction:
    """The transaction queued on a redis-py pipeline, as the fence reads and rewrites it.

    redis-py keeps a pipeline's queued commands in ``command_stack``, the scripts queued
    through it (``Script(..., client=pipeline)``, loaded before the transaction is sent) in
    ``scripts``, whether it WATCHes in ``watching``, and parses each reply with its
    ``response_callbacks``; ``immediate_execute_command`` sends a command at once (after a
    WATCH, on the pipeline's connection), and ``transaction`` says whether ``execute()``
    wraps the queued commands in MULTI/EXEC. None of these is documented API.
    """

    __slots__ = ('_execute', 'pipeline')

    def __init__(self, pipeline: Pipeline, execute: Callable[[bool], list[Any]]) -> None:
        self.pipeline = pipeline
        self._execute = execute

    @property
    def commands(self) -> list[QueuedCommand]:
        """The queued commands, in order (a copy)."""
        return list(self.pipeline.command_stack)

    def replace_commands(self, commands: Iterable[QueuedCommand]) -> None:
        """Queue ``commands`` instead of what is queued."""
        self.pipeline.command_stack[:] = commands

    def add_command(self, *args: Any) -> None:
        """Queue one more command (its reply is not parsed)."""
        self.pipeline.command_stack.append((args, {}))

    @property
    def has_scripts(self) -> bool:
        """Whether scripts were queued through the pipeline (``Script(..., client=pipeline)``)."""
        return bool(self.pipeline.scripts)

    @property
    def scripts(self) -> set[Any]:
        """The scripts queued through the pipeline (a copy); redis-py forgets them once it sent the transaction."""
        return set(self.pipeline.scripts)

    def replace_scripts(self, scripts: Iterable[Any]) -> None:
        """Queue ``scripts`` again (after a transaction that did not go through)."""
        self.pipeline.scripts = set(scripts)

    @property
    def watching(self) -> bool:
        """Whether the pipeline WATCHes keys (the caller's own optimistic transaction)."""
        return bool(self.pipeline.watching)

    def send_now(self, *args: Any) -> Any:
        """Send one command now, on the pipeline's connection, and return its parsed reply."""
        return self.pipeline.immediate_execute_command(*args)

    def execute(self, raise_on_error: bool) -> list[Any]:
        """redis-py's own ``execute()``: send what is queued, as one transaction."""
        return self._execute(raise_on_error)

    def execute_alone(self, raise_on_error: bool) -> list[Any]:
        """Send what is queued as a plain pipeline, without MULTI/EXEC, then reset as ``execute()`` does.

        For one script call while nothing is watched: a script is atomic by itself, and the
        transaction around it would only add two commands. (redis-py's ``transaction`` flag
        chooses between the two; it is set back at once.)
        """
        # (An instance attribute that the typing of redis-py's client method of that name hides.)
        pipeline: Any = self.pipeline
        was = pipeline.transaction
        pipeline.transaction = False
        try:
            return self._execute(raise_on_error)
        finally:
            pipeline.transaction = was

    def parse_reply(self, command: QueuedCommand, reply: Any) -> Any:
        """``reply`` to ``command`` as redis-py's ``execute()`` gives it (through its response callback)."""
        args, options = command
        callback = self.pipeline.response_callbacks.get(args[0])
        if callback is None:
            return reply
        return callback(reply, **{name: value for name, value in options.items() if name != 'keys'})


class ExecuteHandler:
    """Stands for ``execute()`` of one pipeline (see :func:`intercept_execute`).

    This one sends the transaction as redis-py does; a subclass says what else it does.
    """

    def __init__(self, transaction: QueuedTransaction) -> None:
        self.transaction = transaction

    def __call__(self, raise_on_error: bool = True) -> list[Any]:
        return self.transaction.execute(raise_on_error)


def intercept_execute(pipeline: Pipeline, handler_class: type[H]) -> H:
    """The handler that stands for ``pipeline.execute()``: put in its place at the first call, the same one after.

    ``execute`` is replaced on this pipeline only (an attribute of the instance); the
    handler reaches redis-py's own through its :class:`QueuedTransaction`. It stays for the
    pipeline's life, across ``reset()``: RQ builds a watched transaction again on the same
    pipeline after a WatchError.
    """
    current = pipeline.execute
    if isinstance(current, handler_class):
        return current
    handler = handler_class(QueuedTransaction(pipeline, current))
    pipeline.execute = handler  # type: ignore[method-assign]
    return handler


_NOTE = '_rq_epoch_'


def note(pipeline: Pipeline, name: str, value: object) -> None:
    """Keep ``value`` with ``pipeline`` under ``name`` for the pipeline's life (across ``reset()``)."""
    setattr(pipeline, _NOTE + name, value)


def noted(pipeline: Pipeline, name: str) -> Any:
    """What :func:`note` kept with ``pipeline`` under ``name``, or None."""
    return getattr(pipeline, _NOTE + name, None)


# -- the failover watch -----------------------------------------------------------------


def hook_connections(
    pool: ConnectionPool, mixin: type, hooked_class: Callable[[type], type], before_get: Callable[[], object]
) -> None:
    """Make every connection of ``pool`` an instance of ``hooked_class(its class)``, a subclass with ``mixin``.

    Three contacts with redis-py's pool: its ``connection_class`` (which it reads for each
    connection it opens) is replaced; its ``get_connection`` is replaced on this pool
    instance, to call ``before_get()`` first; and a connection opened before (not yet a
    ``mixin``) changes class as it is handed out (a class that refuses the change, such as
    one with ``__slots__`` of its own, is left as it is).
    """
    base = pool.connection_class
    if not issubclass(base, mixin):
        pool.connection_class = hooked_class(base)
    original = pool.get_connection

    def get_connection(*args: Any, **kwargs: Any) -> Any:
        before_get()
        connection = original(*args, **kwargs)
        if not isinstance(connection, mixin):
            try:
                connection.__class__ = hooked_class(type(connection))
            except TypeError:
                pass
        return connection

    pool.get_connection = get_connection  # type: ignore[method-assign]


def unhooked_connection_class(pool: ConnectionPool, mixin: type) -> type:
    """The pool's connection class as it was before :func:`hook_connections` (the class itself if not hooked)."""
    return next(cls for cls in pool.connection_class.__mro__ if not issubclass(cls, mixin))


def reads_take_timeout(connection_class: type) -> bool:
    """Whether the class's ``read_response`` takes a ``timeout`` (redis-py 5.0.2 and later)."""
    try:
        return 'timeout' in inspect.signature(connection_class.read_response).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        return False


def socket_of(connection: Any) -> socket.socket | None:
    """The connection's socket (redis-py's ``_sock``), or None while it is not connected."""
    return getattr(connection, '_sock', None)


def connections_in_use(pool: ConnectionPool) -> list[Any]:
    """The pool's connections handed out and not given back (redis-py's ``_in_use_connections``)."""
    return list(getattr(pool, '_in_use_connections', ()))
