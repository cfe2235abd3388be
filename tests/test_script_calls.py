"""The script calls and requests of one job, on each path a job takes: counted, exactly.

Real ``rq worker`` processes, a real server, one no-op job enqueued into an idle setup. The
server's ``MONITOR`` stream names every command a client sends (the commands a script runs
are not in it), so each ``EVALSHA`` is attributed to its script by its SHA. The sweep
interval is long (120 s), so that nothing periodic (a watcher's refresh, a sweep, a
bench waiter's turn) falls in the window: what is counted is the job's own path, from the
enqueue until every worker it woke waits again.

The paths:

* one queue: RQ's own ``BLMOVE`` takes the job;
* several queues, one worker: the ``take`` script takes it, and the worker watches alone;
* with a watcher: an idle fleet on several queues; the watcher takes the job and hands
  the watch on to a waiter in the same script, and the waiter claims it (a plain
  ``SET NX``, no script, sent with its read of the queues);
* after a hand-over: the next job, taken by the worker the watch was handed to.

The numbers asserted are the ones the code reaches: a change that adds a script call or a
request on a job's path fails here, and must change this file, saying why.

Two of a job's calls are the commit script: the work-horse's preparation (RQ's transaction
that marks the job "started", fenced since 2026-12-07: sent late, after a sweep took the
lease, it marked a job another worker had finished "started" for good) and its outcome.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis
from rq.job import JobStatus

from rq_epoch import Queue, Worker
from rq_epoch.protocol import keys, scripts
from tests.conftest import WorkerProcess, wait_for

COUNTING = 'tests.workers.EpochWorkerCountingWakes'
QUEUES = ('calls-a', 'calls-b', 'calls-c')
SET_ID = keys.queue_set_id(keys.queue_key(name) for name in QUEUES)
#: Nothing periodic in a window of a few seconds: the watcher refreshes every 20 s, the
#: waiters block a minute at a time, and no sweep is due.
QUIET = {'RQ_EPOCH_SWEEP_INTERVAL': '120'}

_NAMES = {
    scripts._script(name).sha: name  # noqa: SLF001 - the SHAs of every verb
    for name in ('grant', 'extend', 'sweep', 'rescue', 'claim', 'commit', 'take', 'watch', 'ticket')
}


class Traffic:
    """The commands every client but the test's own sent while it was recorded."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []  # (client address, command line)

    def scripts(self) -> Counter[str]:
        """Script calls by script name."""
        calls: Counter[str] = Counter()
        for _client, line in self.commands:
            parts = line.split()
            if parts and parts[0].upper() == 'EVALSHA':
                calls[_NAMES.get(parts[1].lower(), parts[1])] += 1
        return calls

    def sent_next(self, name: str) -> list[str]:
        """For each ``name`` command, the name of the next command its client sent ('' if none)."""
        names = [(client, line.split()[0].upper() if line else '') for client, line in self.commands]
        return [
            next((later for other, later in names[at + 1 :] if other == client), '')
            for at, (client, command) in enumerate(names)
            if command == name
        ]

    def by_name(self) -> Counter[str]:
        """Requests by command name (a transaction's commands each count, as the server reads them)."""
        return Counter(line.split()[0].upper() for _client, line in self.commands if line)


@contextmanager
def recorded(conn: redis.Redis, ignore: set[str]) -> Iterator[Traffic]:
    """Record, with ``MONITOR``, every command sent meanwhile by clients not in ``ignore``
    (addresses ``host:port``)."""
    traffic = Traffic()
    monitor_client = redis.Redis(connection_pool=conn.connection_pool)
    started = threading.Event()
    done = threading.Event()

    def read() -> None:
        with monitor_client.monitor() as monitor:
            started.set()
            connection = monitor.connection
            assert connection is not None
            while not done.is_set():
                if not connection.can_read(timeout=0.05):
                    continue
                entry = monitor.next_command()
                client = entry.get('client_address', '') + ':' + str(entry.get('client_port', ''))
                if client in ignore or entry.get('client_type') == 'lua':
                    continue
                traffic.commands.append((client, entry['command']))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(10)
    try:
        yield traffic
    finally:
        done.set()
        reader.join(10)


def own_addresses(*clients: redis.Redis) -> set[str]:
    """The ``host:port`` of this test's own connections (they are left out of the count)."""
    names = {f'calls-test-{id(client)}' for client in clients}
    for client in clients:
        client.client_setname(f'calls-test-{id(client)}')
    return {entry['addr'] for entry in clients[0].client_list() if entry.get('name') in names}


def counter(worker: WorkerProcess, name: str) -> int:
    value = 0
    for line in worker.output().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == 'COUNTER' and parts[1] == name:
            value = int(parts[2])
    return value


def run_one(conn: redis.Redis, queue_name: str, settled: Callable[[], bool]) -> Traffic:
    """Enqueue one job on ``queue_name`` and record the traffic until it finished and ``settled()``."""
    queue = Queue(queue_name, connection=conn)
    ignore = own_addresses(conn)
    with recorded(conn, ignore) as traffic:
        job = queue.enqueue('tests.jobs.add', 1, 2)
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the job done')
        wait_for(settled, 30, what='every worker waiting again')
    return traffic


def idle(conn: redis.Redis, n: int) -> Callable[[], bool]:
    """Every one of ``n`` workers registered and idle."""

    def check() -> bool:
        names = conn.smembers(keys.workers_key())
        return len(names) == n and all(conn.hget(name, 'state') == b'idle' for name in names)

    return check


def test_one_queue(conn, start_worker) -> None:
    """RQ's BLMOVE, then the grant in RQ's transaction, and the commit script in place of the
    work-horse's preparation and of its outcome's transaction."""
    worker = start_worker('calls-one', worker_class=COUNTING, env=QUIET)
    wait_for(lambda: counter(worker, 'blocking_moves') >= 1, 60, what='the worker waiting')
    moves = counter(worker, 'blocking_moves')
    traffic = run_one(conn, 'calls-one', lambda: counter(worker, 'blocking_moves') > moves and idle(conn, 1)())
    assert traffic.scripts() == Counter({'grant': 1, 'commit': 2}), traffic.scripts()
    # Transactions: the enqueue's two, the worker's start of the execution (with the
    # grant), the outcome's commit (under RQ's WATCH of the dependents) and RQ's heartbeat
    # after the job. The preparation's commit watches nothing: it is sent without MULTI/EXEC.
    assert traffic.by_name()['MULTI'] == 5, traffic.by_name()


def test_several_queues_one_worker(conn, start_worker) -> None:
    """The take that moves the job (and hands the lone watcher's watch on), the grant, the
    fenced preparation and outcome, and the take that finds no job (and claims the watch back)."""
    worker = start_worker(*QUEUES, worker_class=COUNTING, env=QUIET)
    wait_for(lambda: conn.get(keys.watch_key(SET_ID)), 60, what='the worker watching')
    wait_for(idle(conn, 1), 30, what='the worker waiting')
    terms = counter(worker, 'watch_terms')

    def settled() -> bool:
        return counter(worker, 'watch_terms') > terms and bool(conn.get(keys.watch_key(SET_ID)))

    traffic = run_one(conn, QUEUES[1], settled)
    assert traffic.scripts() == Counter({'take': 2, 'grant': 1, 'commit': 2}), traffic.scripts()
    # The take read the job it moved: no HGETALL of RQ's fetch follows it.
    assert traffic.by_name()['HGETALL'] == 0, traffic.by_name()


def start_fleet(conn: redis.Redis, start_worker: Callable[..., WorkerProcess], n: int) -> list[WorkerProcess]:
    fleet = [start_worker(*QUEUES, worker_class=COUNTING, env=QUIET) for _ in range(n)]
    wait_for(idle(conn, n), 60, what=f'{n} workers idle')
    wait_for(lambda: conn.get(keys.watch_key(SET_ID)), 60, what='a watcher')
    # Every worker took once (and so claimed its place), and no token waits on the baton list.
    wait_for(lambda: all(counter(w, 'empty_takes') >= 1 for w in fleet), 60, what='every worker waiting')
    wait_for(lambda: not conn.exists(keys.baton_key(SET_ID)), 60, what='no token left')
    return fleet


def holder_of(conn: redis.Redis, fleet: list[WorkerProcess], key: str) -> WorkerProcess:
    name = conn.get(key)
    assert name is not None
    pid = int(conn.hget(keys.worker_key(name.decode()), 'pid') or 0)
    return next(worker for worker in fleet if worker.pid == pid)


def fleet_settled(conn: redis.Redis, fleet: list[WorkerProcess], taker: WorkerProcess) -> Callable[[], bool]:
    """The watch held by another worker in a new term, no token left, the taker back (its
    take found no job), every worker idle."""
    terms = sum(counter(w, 'watch_terms') for w in fleet)
    empty = counter(taker, 'empty_takes')

    def check() -> bool:
        return bool(
            conn.get(keys.watch_key(SET_ID))
            and not conn.exists(keys.baton_key(SET_ID))
            and sum(counter(w, 'watch_terms') for w in fleet) > terms
            and counter(taker, 'empty_takes') > empty
            and idle(conn, len(fleet))()
        )

    return check


def test_with_a_watcher_and_after_a_hand_over(conn, start_worker) -> None:
    """Four idle workers: the watcher takes the job and hands the watch on; then the next
    job, taken by the worker it was handed to.

    Two takes: the watcher's (it moves the job and wakes a waiter) and the one of the worker
    back from the job (it finds none, and waits); the woken waiter claims the watch with a
    plain ``SET NX``, sent with its read of the queues on its tracking connection, no script;
    the grant and the two commits (preparation, outcome) ride in RQ's own transactions.
    """
    fleet = start_fleet(conn, start_worker, 4)
    for path in ('with a watcher', 'after a hand-over'):
        first = holder_of(conn, fleet, keys.watch_key(SET_ID))
        traffic = run_one(conn, QUEUES[0], fleet_settled(conn, fleet, first))
        assert traffic.scripts() == Counter({'take': 2, 'grant': 1, 'commit': 2}), (path, traffic.scripts())
        assert traffic.by_name()['SET'] == 1, (path, traffic.by_name())  # the woken waiter's claim
        # ... sent with its read of the queues, on its tracking connection
        assert traffic.sent_next('SET') == ['EXISTS'], (path, traffic.commands)
        assert holder_of(conn, fleet, keys.watch_key(SET_ID)) is not first, path


def test_a_worker_checks_the_servers_version_at_its_first_sweep_only(conn, server) -> None:
    """The worker keeps its sweeper: the sweeps it wins after the first send no ``INFO`` of their
    own (the version check), only the scripts' calls."""
    worker_conn = redis.Redis.from_url(server.url)
    worker = Worker(['versioned'], connection=worker_conn)
    ignore = own_addresses(conn)

    def won_sweep() -> Counter[str]:
        conn.delete(keys.tickets_key())  # the queue's ticket is free again
        with recorded(conn, ignore) as traffic:
            assert worker.sweep() is not None
        return traffic.by_name()

    first, second = won_sweep(), won_sweep()
    assert first['INFO'] == 1
    assert second['INFO'] == 0
    assert second['EVALSHA'] > 0  # the sweep ran: its ticket and its script
    worker_conn.close()
