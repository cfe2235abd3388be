"""The fence of the lease epoch: an execution's outcome lands only while it holds the lease.

A newer lease always wins. Once a sweep has taken an execution's lease (the worker froze,
the network went away) or a newer execution has been granted one, anything the old
execution writes about the job's outcome must be refused: no Result, no status change, no
registry move, no dependents, no webhook.

RQ records an outcome as one transaction built on a pipeline; every outcome path (success,
failure, retry, stop, a dead work-horse) removes the execution with
``Worker.cleanup_execution(job, pipeline)``. There the worker *arms* the pipeline with the
execution's :class:`Fence`. When RQ then calls ``pipeline.execute()``, the queued commands
are not sent as they are: they travel as arguments of the ``commit`` script, which runs
them only if the job's lease member still exists and the job's ``lease_execution`` is this
execution. The check and the write are one atomic step in the server, in the same single
round trip as RQ's own commit; a WATCH that RQ set (on the job's dependents) still guards
the transaction around it. Without a WATCH, the script call is sent alone: it is one atomic
step by itself, and MULTI/EXEC around it would add two commands and nothing else. The
fence takes the place of that one pipeline's ``execute()``, and reads and rewrites its
queued commands, through :mod:`rq_epoch.adapters.redis_py` (redis-py has no public hook
for either).

An outcome is refused on evidence that someone else took over: a sweep's record of taking
the lease, or a newer lease holder. An execution that holds no lease on the server it talks
to (a failover lost its take and grant) is refused too while its job can still be taken,
from its queue or the intermediate list: the job runs again, and ends with one outcome, not
two. Otherwise an execution that was never granted a lease commits (once: the script
records it, so a retried commit is refused as "gone", like the retried commit of a leased
execution, whose lease the first attempt removed).

A transaction that already carries a script call cannot be nested inside another script,
and a script cannot call a command with more arguments than Lua's stack holds; such a
commit (rare: a unique or rate-limited re-enqueue, a job with thousands of dependents) is
fenced by WATCHing the job hash instead, which every change of lease holder writes.

A connection error (or an outage answer) while the commit is sent is raised as
:class:`~rq_epoch.errors.OutcomeInterrupted`, which RQ's ``except Exception`` blocks around
their commits let through to the worker's outcome writer, which sends the outcome again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError, WatchError

from ..adapters import redis_py
from ..compat import text
from ..errors import CONNECTION_ERRORS, OutcomeInterrupted, OutcomeRefused, ServerOutageError, connection_error_behind
from ..protocol import keys, scripts, verbs
from .failover import is_outage

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline

__all__ = ['Fence', 'arm']

_SCRIPT_COMMANDS = frozenset({'EVAL', 'EVALSHA', 'EVAL_RO', 'EVALSHA_RO', 'FCALL', 'FCALL_RO'})
#: Most arguments of one command the commit script passes through ``unpack`` (Lua's C
#: stack holds 8,000 values in Redis and Valkey); a longer command goes the WATCH way.
_MAX_UNPACKED = 7000


@dataclass(frozen=True)
class Fence:
    """The identity an outcome must hold the lease under: queue, job and execution."""

    queue: str
    job_id: str
    execution_id: str

    @property
    def member(self) -> str:
        """The lease member: the job id (one lease per job; ``lease_execution`` names its holder)."""
        return self.job_id

    @property
    def composite_key(self) -> str:
        """The execution as RQ names it, ``<job_id>:<execution_id>``."""
        return f'{self.job_id}:{self.execution_id}'

    @property
    def script_keys(self) -> list[str]:
        return [
            keys.leases_key(self.queue),
            keys.job_key(self.job_id),
            keys.stats_key(self.queue),
            keys.committed_key(self.composite_key),
            keys.queue_key(self.queue),
            keys.intermediate_key(self.queue),
        ]

    def check(self, connection: Redis | Pipeline) -> OutcomeRefused | None:
        """Whether this execution still holds the lease: None if it does, else the refusal.

        Writes nothing and counts nothing (used before running a callback).
        """
        reply = verbs.commit(connection, self.script_keys, self.script_args('0', 0))
        return None if reply.lands else self.refusal(reply)

    def script_args(self, mode: str, ncommands: int) -> list[Any]:
        """The commit script's fixed arguments (the commands, if any, follow them)."""
        return [self.member, self.execution_id, mode, ncommands, keys.COMMITTED_RECORD_TTL]

    def refusal(self, reply: verbs.CommitReply) -> OutcomeRefused:
        """The error for a commit the script refused."""
        return OutcomeRefused(self.job_id, self.execution_id, reply.reason, reply.detail, reply.holder)


def arm(pipeline: Pipeline, fence: Fence, outcome: bool = True) -> None:
    """Make the next ``execute()`` of ``pipeline`` a commit fenced by ``fence``.

    ``outcome``: the transaction records the job's outcome (a refusal is counted, and an
    execution that holds no lease leaves the record that it committed). With False it is
    the preparation before the job runs: it lands on the same terms, but a refusal is not
    counted and no record is left, so the outcome that follows commits as it would have.

    Later ``execute()`` calls on the same pipeline (RQ 2 sends a second, bookkeeping-only
    transaction in its failure path) go out unfenced, unless the pipeline is armed again.
    """
    handler = redis_py.intercept_execute(pipeline, _FencedExecute)
    handler.fence, handler.outcome = fence, outcome


class _FencedExecute(redis_py.ExecuteHandler):
    """Stands for ``execute()`` of an outcome's pipeline: the next call after :func:`arm` is a fenced commit."""

    fence: Fence | None = None
    outcome: bool = True

    def __call__(self, raise_on_error: bool = True) -> list[Any]:
        armed, self.fence = self.fence, None
        mode = '1' if self.outcome else '0'
        transaction = self.transaction
        if armed is None:
            return transaction.execute(raise_on_error)
        commands = transaction.commands
        try:
            if transaction.has_scripts or any(
                len(args) > _MAX_UNPACKED or _name(args) in _SCRIPT_COMMANDS for args, _ in commands
            ):
                return _commit_watched(transaction, commands, armed, raise_on_error, mode)
            return _commit_scripted(transaction, commands, armed, raise_on_error, mode)
        except CONNECTION_ERRORS as exc:
            raise OutcomeInterrupted(armed.job_id, armed.execution_id, exc) from exc
        except WatchError as exc:
            # Under WATCH (RQ 3 watches a job's dependents around every success) redis-py
            # reports a connection error as a WatchError: RQ's loop would build the commit
            # again and, if the first one landed, meet it as "gone", a refusal. It is the
            # connection error it is: the outcome writer sends the outcome again.
            cause = connection_error_behind(exc)
            if cause is None:
                raise
            raise OutcomeInterrupted(armed.job_id, armed.execution_id, cause) from cause


def _name(args: tuple[Any, ...]) -> str:
    return text(args[0]).upper() if args else ''


def _commit_scripted(
    transaction: redis_py.QueuedTransaction,
    commands: list[redis_py.QueuedCommand],
    fence: Fence,
    raise_on_error: bool,
    mode: str = '1',
) -> list[Any]:
    """Send the queued ``commands`` as arguments of the commit script (one round trip).

    ``mode``: the commit script's ARGV[3], '1' for an outcome, '0' for a preparation (see :func:`arm`).
    """
    argv: list[Any] = fence.script_args(mode, len(commands))
    for args, _options in commands:
        argv.append(len(args))
        argv.extend(args)
    script = scripts.commit()
    call = ('EVALSHA', script.sha, len(fence.script_keys), *fence.script_keys, *argv)
    watching = transaction.watching
    for _ in range(2):
        transaction.replace_commands([(call, {})])
        # Under RQ's WATCH the call goes inside RQ's MULTI/EXEC, which the WATCH guards;
        # otherwise alone: the script is one atomic step by itself.
        reply = (transaction.execute(False) if watching else transaction.execute_alone(False))[0]
        if not isinstance(reply, NoScriptError):
            break
        # The server restarted since the script was loaded: nothing ran. Load it, and
        # start again (RQ's loop rebuilds a watched transaction on WatchError).
        _load(transaction, script)
        if watching:
            raise WatchError('the commit script had to be loaded; the transaction is rebuilt')
    if isinstance(reply, Exception):
        _raise_outage(reply)
        raise reply
    commit = verbs.CommitReply.read(reply)
    if not commit.lands:
        raise fence.refusal(commit)
    for command_reply in commit.replies:
        # A server that takes no writes now (NOREPLICAS, READONLY, ...) refuses every write
        # of the script alike: nothing landed, and the whole commit can be sent again.
        if isinstance(command_reply, Exception):
            _raise_outage(command_reply)
    return _replies(transaction, commands, list(commit.replies), raise_on_error)


def _raise_outage(error: BaseException) -> None:
    """Raise :class:`ServerOutageError` (a connection error the worker rides out) for an
    error reply that means the server takes no writes now; return for any other."""
    if is_outage(error):
        raise ServerOutageError(str(error)) from error


def _load(transaction: redis_py.QueuedTransaction, script: scripts.ServerScript) -> None:
    transaction.send_now('SCRIPT LOAD', script.source)


def _replies(
    transaction: redis_py.QueuedTransaction,
    commands: list[redis_py.QueuedCommand],
    replies: list[Any],
    raise_on_error: bool,
) -> list[Any]:
    """Each command's reply through redis-py's response callback, as ``execute()`` gives them."""
    data = []
    for command, reply in zip(commands, replies, strict=True):
        if isinstance(reply, Exception):
            if raise_on_error:
                raise reply
            data.append(reply)
        else:
            data.append(transaction.parse_reply(command, reply))
    return data


def _commit_watched(
    transaction: redis_py.QueuedTransaction,
    commands: list[redis_py.QueuedCommand],
    fence: Fence,
    raise_on_error: bool,
    mode: str = '1',
) -> list[Any]:
    """Fence a transaction (its queued ``commands``) that carries a script call: WATCH the job
    hash, check, commit.

    For an execution that holds no lease, the record that it committed is written by the
    same transaction, so it exists exactly when the outcome landed (not for a preparation,
    ``mode`` '0').
    """
    rq_watching = transaction.watching
    loaded = transaction.scripts
    script = scripts.commit()
    for _ in range(20):
        transaction.send_now('WATCH', keys.job_key(fence.job_id), keys.committed_key(fence.composite_key))
        try:
            reply = verbs.CommitReply.read(
                transaction.send_now(
                    'EVALSHA', script.sha, len(fence.script_keys), *fence.script_keys, *fence.script_args(mode, 0)
                )
            )
        except NoScriptError:
            _load(transaction, script)
            continue
        if not reply.lands:
            raise fence.refusal(reply)
        unleased = not reply.leased and mode == '1'
        if unleased:
            transaction.add_command(
                'SET', keys.committed_key(fence.composite_key), '1', 'EX', keys.COMMITTED_RECORD_TTL
            )
        try:
            replies = list(transaction.execute(raise_on_error))
            return replies[:-1] if unleased else replies
        except WatchError as exc:
            # redis-py reports a connection error under WATCH as a WatchError; an outage
            # (the server refused the queued writes) is not a change of the job.
            reason = exc.__cause__ or exc.__context__
            if reason is not None:
                _raise_outage(reason)
            if rq_watching or connection_error_behind(exc) is not None:
                raise
            transaction.replace_commands(commands)
            transaction.replace_scripts(loaded)
            continue
        except ResponseError as exc:  # a write refused while queued aborts the transaction
            _raise_outage(exc)
            raise
    raise WatchError(f'the job {fence.job_id} kept changing while its outcome was being committed')
