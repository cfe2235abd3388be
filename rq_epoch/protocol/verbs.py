"""One typed wrapper per server-side script: its call, and the decoding of its reply.

Every reply a script sends is read here, and only here, into a frozen dataclass whose fields
name what the script's header (``lua/<verb>.lua``) says it returns. The rest of the package
reads those fields; nothing else knows a reply's shape.

=========  ============================  ==========================================
script     wrapper                       reply
=========  ============================  ==========================================
grant      :func:`grant`                 :class:`GrantReply`
extend     :func:`extend`                :class:`ExtendReply`
commit     :func:`commit`                :class:`CommitReply`
claim      :func:`claim`                 a tuple of :class:`DeadLetterClaim`
sweep      :func:`sweep`                 :class:`SweepReply`
rescue     :func:`rescue`                :class:`SweepReply`
take       :func:`take`                  :class:`TakeReply`
watch      :func:`watch`                 :class:`Role`
ticket     :func:`ticket`                :class:`SweepTickets`
stopmark   :func:`stop_mark`             :class:`StopMarkReply`
handback   :func:`hand_back`             :class:`HandBackReply`
=========  ============================  ==========================================

Some calls are not sent by a wrapper but queued on a pipeline, to ride in a round trip that
RQ sends anyway: the grant and the extend in RQ's own transactions (``registry.py``), the
commit in place of an outcome's transaction (``fence.py``). Their replies come back from the
pipeline and are read with the same ``read`` of the reply's class (:meth:`ExtendReply.read`,
:meth:`CommitReply.read`).

"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from ..compat import text
from . import scripts
from .report import LeaseVerdict
from .server import PrimaryState
from .verdicts import Verdict

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    'CommitReply',
    'ConfirmReply',
    'DeadLetterClaim',
    'ExtendReply',
    'GrantReply',
    'HandBackReply',
    'Role',
    'StopMarkReply',
    'SweepReply',
    'SweepTickets',
    'TakeReply',
    'claim',
    'commit',
    'extend',
    'grant',
    'hand_back',
    'rescue',
    'stop_mark',
    'sweep',
    'take',
    'ticket',
    'watch',
]


# -- grant -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantReply:
    """What the grant script did (``lua/grant.lua``)."""

    #: False when the job hash is gone (nothing was written).
    granted: bool
    #: The server process that stamped the lease (the epoch).
    run_id: str
    #: The lease's deadline, server time in seconds; 0 when not granted.
    deadline: float

    @classmethod
    def read(cls, raw: Sequence[Any]) -> GrantReply:
        """Decode the script's reply ``{granted, run_id, deadline}``."""
        granted, run_id, deadline = raw
        return cls(granted=int(granted) == 1, run_id=text(run_id), deadline=float(text(deadline)))


def grant(connection: Redis, keys: list[str], args: list[Any]) -> GrantReply:
    """Run the grant script (KEYS and ARGV as in ``lua/grant.lua``)."""
    return GrantReply.read(scripts.grant()(connection, keys, args))


# -- extend ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtendReply:
    """What a heartbeat's extend script found (``lua/extend.lua``)."""

    #: True when the lease was this execution's and was extended.
    extended: bool
    #: The server process that stamped the lease (the epoch now).
    run_id: str
    #: The lease's new deadline, server time in seconds; 0 when not extended.
    deadline: float
    #: When not extended: the verdict of the sweep that took this execution's lease (its
    #: record ``taken:<execution_id>`` in the job hash), or '' when no sweep took it (the
    #: execution's own outcome ended the lease, or a newer grant replaced it).
    taken: str

    @classmethod
    def read(cls, raw: Sequence[Any]) -> ExtendReply:
        """Decode the script's reply ``{extended, run_id, deadline, taken}``."""
        extended, run_id, deadline, taken = raw
        return cls(extended=int(extended) == 1, run_id=text(run_id), deadline=float(text(deadline)), taken=text(taken))


def extend(connection: Redis, keys: list[str], args: list[Any]) -> ExtendReply:
    """Run the extend script (KEYS and ARGV as in ``lua/extend.lua``)."""
    return ExtendReply.read(scripts.extend()(connection, keys, args))


# -- commit ------------------------------------------------------------------------------

#: The first element of the commit script's reply: refused, or the outcome lands for an
#: execution that holds its lease (2: for one that was never granted a lease).
_REFUSED, _LEASED = 0, 1


@dataclass(frozen=True)
class CommitReply:
    """What the commit script decided about an execution's outcome (``lua/commit.lua``).

    When the outcome lands, ``replies`` has one reply per command the script ran (an error
    reply where a command failed, as in ``MULTI``/``EXEC``). When it is refused, nothing was
    written and ``reason``, ``detail`` and ``holder`` say why (see
    :class:`rq_epoch.OutcomeRefused`).
    """

    #: The outcome lands: the execution holds its lease, or was never granted one, nobody
    #: took over and the job is in none of the lists it can be taken from.
    lands: bool
    #: The execution held its lease (False for one never granted a lease, and for a refusal).
    leased: bool
    #: One reply per command, when the outcome lands.
    replies: tuple[Any, ...] = ()
    #: Why the outcome was refused: ``taken``, ``superseded``, ``queued`` or ``gone``; '' when it lands.
    reason: str = ''
    #: The verdict of the sweep that took the lease (``taken``), the newer execution's id
    #: (``superseded``), or the key of the list the job waits in (``queued``).
    detail: str = ''
    #: The job's ``lease_execution`` when the outcome was refused ('' if none).
    holder: str = ''

    @classmethod
    def read(cls, raw: Sequence[Any]) -> CommitReply:
        """Decode ``{1, reply...}`` (leased), ``{2, reply...}`` (never granted) or
        ``{0, reason, detail, holder}`` (refused)."""
        status, *rest = raw
        status = int(status)
        if status == _REFUSED:
            reason, detail, holder = rest
            return cls(lands=False, leased=False, reason=text(reason), detail=text(detail), holder=text(holder))
        return cls(lands=True, leased=status == _LEASED, replies=tuple(rest))


def commit(connection: Redis, keys: list[str], args: list[Any]) -> CommitReply:
    """Run the commit script (KEYS and ARGV as in ``lua/commit.lua``)."""
    return CommitReply.read(scripts.commit()(connection, keys, args))


# -- stop mark and hand-back: a worker told to stop -------------------------------------------


@dataclass(frozen=True)
class StopMarkReply:
    """What the stopmark script did (``lua/stopmark.lua``)."""

    #: True when the lease was this execution's, not expired, and is now marked stopping.
    marked: bool
    #: The server's TIME of the call (the mark's time when marked), in seconds.
    marked_at: float
    #: The end of the stop window, server time; 0 when not marked.
    until: float

    @classmethod
    def read(cls, raw: Sequence[Any]) -> StopMarkReply:
        """Decode ``{marked, marked_at, until}``."""
        marked, marked_at, until = raw
        return cls(marked=int(marked) == 1, marked_at=float(text(marked_at)), until=float(text(until)))


def stop_mark(connection: Redis, keys: list[str], args: list[Any]) -> StopMarkReply:
    """Run the stopmark script (KEYS and ARGV as in ``lua/stopmark.lua``)."""
    return StopMarkReply.read(scripts.stopmark()(connection, keys, args))


@dataclass(frozen=True)
class HandBackReply:
    """What the handback script decided (``lua/handback.lua``).

    When refused, nothing was written (but the queue's ``refused`` counter, on evidence of
    another holder) and ``reason``, ``detail`` and ``holder`` say why, as for a refused
    outcome (:class:`CommitReply`).
    """

    #: True when the job is back at the front of its queue.
    handed_back: bool
    #: Server time of the hand-back; 0 when refused.
    at: float = 0.0
    #: Why it was refused: ``taken`` (a sweep took the lease), ``superseded`` (a newer
    #: execution holds the job) or ``gone`` (the execution's own outcome landed, or the job
    #: was deleted); '' when handed back.
    reason: str = ''
    #: The verdict of the sweep that took the lease (``taken``), the newer execution's id
    #: (``superseded``), or ``handed_back`` when this execution's own hand-back had landed
    #: already (``gone``, a call sent again).
    detail: str = ''
    #: The job's ``lease_execution`` when refused ('' if none).
    holder: str = ''

    @property
    def landed_before(self) -> bool:
        """True when the refusal says that this execution's own earlier hand-back landed."""
        return self.reason == 'gone' and self.detail == 'handed_back'

    @classmethod
    def read(cls, raw: Sequence[Any]) -> HandBackReply:
        """Decode ``{1, at}`` (handed back) or ``{0, reason, detail, holder}`` (refused)."""
        status, *rest = raw
        if int(status) == 1:
            return cls(handed_back=True, at=float(text(rest[0])))
        reason, detail, holder = rest
        return cls(handed_back=False, reason=text(reason), detail=text(detail), holder=text(holder))


def hand_back(connection: Redis, keys: list[str], args: list[Any]) -> HandBackReply:
    """Run the handback script (KEYS and ARGV as in ``lua/handback.lua``)."""
    return HandBackReply.read(scripts.handback()(connection, keys, args))


# -- confirm -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfirmReply:
    """What the confirm script wrote before ``WAIT`` (``lua/confirm.lua``): which server it ran on."""

    #: ``<run_id>:<master_replid>``: the server process, and its term as primary.
    server: str
    #: Replicas connected to it when the script ran.
    connected: int
    #: False for a primary promoted (from a replica) so lately that having no replica says
    #: nothing yet: its old primary may be on its way back as its replica.
    settled: bool = True

    @classmethod
    def read(cls, raw: Sequence[Any]) -> ConfirmReply:
        """Decode ``{server, connected, settled}``."""
        server, connected, settled = raw
        return cls(server=text(server), connected=int(connected), settled=int(settled) == 1)


# -- claim -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetterClaim:
    """A dead letter a claim took: its entry ``<queue>|<job_id>`` of ``<prefix>:epoch:finishing``."""

    queue: str
    job_id: str

    @property
    def member(self) -> str:
        """The entry as the finishing set holds it."""
        return f'{self.queue}|{self.job_id}'

    @classmethod
    def read(cls, raw: Any) -> DeadLetterClaim:
        """Decode one member of the claim script's reply."""
        queue, _, job_id = text(raw).partition('|')
        return cls(queue=queue, job_id=job_id)


def claim(connection: Redis, keys: list[str], args: list[Any]) -> tuple[DeadLetterClaim, ...]:
    """Run the claim script (KEYS and ARGV as in ``lua/claim.lua``): the dead letters it claimed."""
    return tuple(DeadLetterClaim.read(member) for member in scripts.claim()(connection, keys, args))


# -- sweep and rescue --------------------------------------------------------------------


@dataclass(frozen=True)
class SweepReply:
    """What one call of the sweep or rescue script did (``reply`` in ``lua/_sweep.lua``)."""

    #: The server process the call ran on (the epoch), and its uptime in seconds.
    run_id: str
    uptime: int
    #: The server's TIME during the call, in seconds.
    now: float
    #: The server's role and primary epoch as the call saw them.
    primary: PrimaryState
    #: True when a batch was full: the caller calls again (sweep only).
    more: bool
    #: Entries the call read and left in place (deferred; every one in a dry run), from the
    #: leases, RQ's started registry and the 0.2.0 leases: the caller adds them to its offsets.
    left_leases: int
    left_stock: int
    left_legacy: int
    #: One verdict per entry judged (or deferred), in the order the script judged them.
    verdicts: tuple[LeaseVerdict, ...]

    @classmethod
    def read(cls, raw: Sequence[Any], queue: str) -> SweepReply:
        """Decode the reply of a call for ``queue``: ``{run_id, uptime, now, role,
        primary_age, replicas_online, replicas_expected, first_seen_as_primary, more,
        left_leases, left_stock, left_legacy, n, records}``, the n records in one string, a
        line each (see :func:`_lease_verdict`)."""
        (
            run_id,
            uptime,
            now,
            role,
            age,
            online,
            expected,
            first,
            more,
            left_leases,
            left_stock,
            left_legacy,
            n,
            records,
        ) = raw
        run_id = text(run_id)
        lines = records.split(b'\n') if int(n) else []
        return cls(
            run_id=run_id,
            uptime=int(uptime),
            now=float(text(now)),
            primary=PrimaryState(
                role=text(role),
                age=float(text(age)),
                first_seen=float(text(first)),
                replicas_online=int(online),
                replicas_expected=int(expected),
            ),
            more=int(more) == 1,
            left_leases=int(left_leases),
            left_stock=int(left_stock),
            left_legacy=int(left_legacy),
            verdicts=tuple(_lease_verdict(queue, run_id, line) for line in lines),
        )


def sweep(connection: Redis, queue: str, keys: list[str], args: list[Any]) -> SweepReply:
    """Run the sweep script on ``queue`` (KEYS and ARGV as in ``lua/sweep.lua``)."""
    return SweepReply.read(scripts.sweep()(connection, keys, args), queue)


def rescue(connection: Redis, queue: str, keys: list[str], args: list[Any]) -> SweepReply:
    """Run the rescue script on ``queue`` (KEYS and ARGV as in ``lua/rescue.lua``)."""
    return SweepReply.read(scripts.rescue()(connection, keys, args), queue)


# -- take, watch, ticket: the idle fleet ---------------------------------------------------


class Role(enum.IntEnum):
    """A worker's place among the idle workers of a set of queues (``lua/_watch.lua``)."""

    #: Waits for the baton: a ``BLPOP`` until its turn to take again.
    NEITHER = 0
    #: Keeps client tracking armed on the queues: an enqueue wakes it alone.
    WATCHER = 2


@dataclass(frozen=True)
class TakeReply:
    """What the take script did (``lua/take.lua``): the job it moved, or the caller's place."""

    #: The position in the call's queues (0-based) of the queue the job came from; None when
    #: every queue was empty.
    index: int | None
    #: The job's id; '' when every queue was empty.
    job_id: str
    #: When a job was moved: whether a waiter was woken to take the watch over (the caller
    #: held the watch, or nobody did).
    woke: bool
    #: When every queue was empty: the caller's place now (:attr:`Role.WATCHER` when it holds
    #: the watch). :attr:`Role.NEITHER` when a job was moved, or the call named no watch.
    role: Role
    #: When the caller waits for the baton: its turn to take again, server time in ms (0 otherwise).
    turn_ms: int = 0
    #: Seconds until that turn (0 otherwise).
    wait: float = 0.0
    #: When a job was moved and the call named the job keys' prefix: the job's hash, read in
    #: the same step, as ``HGETALL`` gives it (empty when the hash is gone). None otherwise.
    job_hash: dict[bytes, bytes] | None = None

    @classmethod
    def read(cls, raw: Sequence[Any], read_job: bool = False) -> TakeReply:
        """Decode ``{i, job_id, woke, job}`` (1-based ``i``; ``job`` the hash's fields and values
        alternating, kept when ``read_job``), or ``{0, '', role, turn, wait}`` when nothing was
        taken."""
        position = int(raw[0])
        if position == 0:
            _, _, role, turn, wait = raw
            return cls(
                index=None, job_id='', woke=False, role=Role(int(role)), turn_ms=int(turn), wait=int(wait) / 1000
            )
        pairs = raw[3]
        job_hash = dict(zip(pairs[::2], pairs[1::2], strict=True)) if read_job else None
        return cls(index=position - 1, job_id=text(raw[1]), woke=int(raw[2]) == 1, role=Role.NEITHER, job_hash=job_hash)


def take(connection: Redis, keys: list[str], args: list[Any]) -> TakeReply:
    """Run the take script (KEYS and ARGV as in ``lua/take.lua``)."""
    return TakeReply.read(scripts.take()(connection, keys, args), read_job=bool(args[1]))


def watch(connection: Redis, keys: list[str], args: list[Any]) -> Role:
    """Run the watch script (KEYS and ARGV as in ``lua/watch.lua``): the caller's place
    (claim), or the place it left (leave)."""
    return Role(int(scripts.watch()(connection, keys, args)))


def claim_free_watch_command(watch_key: str, token: str, ttl_ms: int) -> tuple[str | int, ...]:
    """The command that claims a watch nobody holds, the claim of a waiter that a token woke
    (the watcher that handed the watch on deleted its key): ``SET NX PX``, the same write as
    a take's claim (see ``lua/_watch.lua``). The waiter sends it with its first read of the
    queues (:meth:`rq_epoch.worker.take.Waker.claim_handed_on`); :class:`HandedOnClaim`
    reads the replies."""
    return ('SET', watch_key, token, 'NX', 'PX', ttl_ms)


@dataclass(frozen=True)
class HandedOnClaim:
    """What a waiter woken by a token found when it claimed the watch handed on and read the
    queues (:func:`claim_free_watch_command`, then ``EXISTS`` of every queue)."""

    #: The waiter holds the watch now; False when another worker claimed it first.
    claimed: bool
    #: A queue had jobs when the waiter read them (the read that armed tracking).
    jobs_waiting: bool

    @classmethod
    def read(cls, set_reply: Any, exists_reply: int) -> HandedOnClaim:
        """Decode ``SET NX``'s reply (OK, or nil when the key was held) and ``EXISTS``'s count."""
        return cls(claimed=set_reply is not None, jobs_waiting=int(exists_reply) > 0)


@dataclass(frozen=True)
class SweepTickets:
    """The sweep tickets a worker was granted (``lua/ticket.lua``)."""

    #: The server's time of the call, in milliseconds.
    now_ms: int
    #: The queues the caller won: it sweeps these now, nobody else does until the next interval.
    granted: tuple[str, ...]
    #: When the call named the caller's turns and it won nothing: its turn to ask again,
    #: server time in ms (0 otherwise).
    turn_ms: int = 0
    #: Seconds until that turn (0 otherwise).
    wait: float = 0.0

    @classmethod
    def read(cls, raw: Sequence[Any], queue_names: Sequence[str]) -> SweepTickets:
        """Decode ``{now_ms, g1, ..., gn}``, one flag per queue of the call, in order, and
        ``turn, wait`` after them when the call named the caller's turns."""
        n = len(queue_names)
        flags = [int(flag) == 1 for flag in raw[1 : n + 1]]
        granted = tuple(name for name, flag in zip(queue_names, flags, strict=True) if flag)
        turn, wait = (int(raw[n + 1]), int(raw[n + 2])) if len(raw) > n + 1 else (0, 0)
        return cls(now_ms=int(raw[0]), granted=granted, turn_ms=turn, wait=wait / 1000)


def ticket(connection: Redis, keys: list[str], args: list[Any], queue_names: Sequence[str]) -> SweepTickets:
    """Run the ticket script (KEYS and ARGV as in ``lua/ticket.lua``; ``queue_names`` are
    the names its ARGV ends with)."""
    return SweepTickets.read(scripts.ticket()(connection, keys, args), queue_names)


#: Verdicts by their name as the scripts write it.
_VERDICTS = {verdict.value.encode(): verdict for verdict in Verdict}


def _field(raw: bytes) -> str:
    """A member or lease epoch of a record; the script percent-encoded it when it held a
    space, a newline or '%'."""
    return unquote_to_bytes(raw).decode('utf-8', 'replace')


def _lease_verdict(queue: str, run_id: str, line: bytes) -> LeaseVerdict:
    """One record line: ``<verdict> <stalled> <max_stalled> <member> <lease_epoch>``.

    The member is the entry as the script read it: a job id (a lease, or the rescue's entry
    of RQ's intermediate list) or ``<job_id>:<execution_id>`` (a 0.2.0 lease, or a stock
    worker's entry of RQ's registry); ``job_id`` is the job it names, '' for a member of
    neither shape.
    """
    verdict, stalled, max_stalled, member, lease_epoch = line.split(b' ')
    member_text = _field(member)
    job_id, colon, execution_id = member_text.partition(':')
    if colon and not (job_id and execution_id and ':' not in execution_id):
        job_id = ''
    return LeaseVerdict(
        queue=queue,
        member=member_text,
        job_id=job_id,
        verdict=_VERDICTS[verdict],
        stalled=int(stalled),
        max_stalled=int(max_stalled),
        lease_epoch=_field(lease_epoch),
        run_id=run_id,
    )
