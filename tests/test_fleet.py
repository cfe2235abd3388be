"""A fleet of idle workers costs the server what stock RQ's does: one wake per job, one sweep per queue.

Real ``rq worker`` processes on several queues. The counting worker class
(``tests.workers.EpochWorkerCountingWakes``) prints its taker's counters as they change,
so each worker's wake-ups are read from its log; sweeps are counted on the server (the
ticket script's grants). A start while the server is down, with ``rq-epoch worker``, is in
tests/test_worker_command.py.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import pytest
import redis
from rq.job import JobStatus

from rq_epoch import Queue
from rq_epoch.protocol import keys
from rq_epoch.worker.worker import wait_while_unavailable
from tests.conftest import WorkerProcess, wait_for

COUNTING = 'tests.workers.EpochWorkerCountingWakes'
QUEUES = ('fleet-a', 'fleet-b', 'fleet-c')
SET_ID = keys.queue_set_id(keys.queue_key(name) for name in QUEUES)


def counter(worker: WorkerProcess, name: str) -> int:
    """The last value of a taker counter the worker printed (0 before any)."""
    value = 0
    for line in worker.output().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == 'COUNTER' and parts[1] == name:
            value = int(parts[2])
    return value


def start_fleet(
    start_worker: Callable[..., WorkerProcess], conn: redis.Redis, n: int, env: dict[str, str]
) -> list[WorkerProcess]:
    fleet = [start_worker(*QUEUES, worker_class=COUNTING, env=env) for _ in range(n)]
    wait_for(lambda: conn.scard(keys.workers_key()) == n, 60, what=f'{n} workers registered')
    wait_for(lambda: conn.get(keys.watch_key(SET_ID)), 30, what='a watcher')
    return fleet


def holder(conn: redis.Redis, fleet: list[WorkerProcess], key: str) -> WorkerProcess:
    """The worker process whose name ``key`` holds."""
    name = conn.get(key)
    assert name is not None
    pid = int(conn.hget(keys.worker_key(name.decode()), 'pid') or 0)
    return next(worker for worker in fleet if worker.pid == pid)


def watcher(conn: redis.Redis, fleet: list[WorkerProcess]) -> WorkerProcess:
    """The worker process that holds the watch of the fleet's queues."""
    return holder(conn, fleet, keys.watch_key(SET_ID))


def test_one_enqueue_makes_at_most_two_of_eight_idle_workers_read_the_queues(conn, start_worker) -> None:
    # A long sweep interval: nothing but the enqueues happens while the workers idle.
    fleet = start_fleet(start_worker, conn, 8, {'RQ_EPOCH_SWEEP_INTERVAL': '30'})
    client_id = conn.client_id()
    connections = [c for c in conn.client_list() if int(c['id']) != client_id]
    assert len(connections) <= 3 * len(fleet)  # stock RQ holds 2 per worker; rq-epoch at most one more

    queue = Queue(QUEUES[1], connection=conn)
    for round_ in range(3):
        woken = one_enqueue(conn, fleet, queue, round_)
        # At most two read the queues: the watcher, and the waiter it hands the watch on to.
        assert 1 <= sum(woken.values()) <= 2, woken
        assert sum(1 for n in woken.values() if n) <= 2, woken
    assert all(worker.proc.poll() is None for worker in fleet)


def one_enqueue(conn: redis.Redis, fleet: list[WorkerProcess], queue: Queue, tag: int) -> dict[int, int]:
    """Enqueue one job into an idle fleet; the wake-ups of each worker (by pid) until the
    watch is held again and every wake-up the job caused is logged."""
    before = {worker.pid: counter(worker, 'wakeups') for worker in fleet}
    terms = {worker.pid: counter(worker, 'watch_terms') for worker in fleet}
    first = watcher(conn, fleet)
    handoffs = counter(first, 'handoffs')
    job = queue.enqueue('tests.jobs.add', tag, 1)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the job done')

    def settled() -> bool:
        # The watcher's take hands the watch on, and the waiter that pops the baton logs its
        # wake-up before its take claims the watch: wait until a watcher holds it in a new
        # term (or the first one still does, having handed nothing on).
        if conn.llen(keys.baton_key(SET_ID)) or not conn.get(keys.watch_key(SET_ID)):
            return False
        holder = watcher(conn, fleet)
        if holder is first and counter(first, 'handoffs') == handoffs:
            return True
        return counter(holder, 'watch_terms') > terms[holder.pid]

    wait_for(settled, 30, what='the watch held again')
    return {worker.pid: counter(worker, 'wakeups') - before[worker.pid] for worker in fleet}


def test_idle_waiters_take_turns_one_per_gap_and_only_the_watcher_refreshes(conn, start_worker) -> None:
    """Between enqueues, the waiters take turns: one takes again per gap (a quarter of the sweep
    interval), whatever their number, and only the watcher refreshes its claim."""
    interval = 2  # the watch's TTL 1 s, a turn every 0.5 s
    gap = interval / 4
    fleet = start_fleet(start_worker, conn, 8, {'RQ_EPOCH_SWEEP_INTERVAL': str(interval)})
    wait_for(lambda: all(counter(worker, 'empty_takes') for worker in fleet), 30, what='every worker waiting')
    for _ in range(3):  # a window in which the watch did not change hands (a loaded machine may delay a refresh)
        the_watcher = watcher(conn, fleet)
        waiters = [worker for worker in fleet if worker is not the_watcher]
        before = {worker.pid: (counter(worker, 'claims'), counter(worker, 'empty_takes')) for worker in fleet}
        started = time.monotonic()
        # Two rounds of turns: every waiter takes twice.
        wait_for(
            lambda b=before, w=waiters: all(counter(worker, 'empty_takes') >= b[worker.pid][1] + 2 for worker in w),
            60,
            what='two turns of every waiter',
        )
        elapsed = time.monotonic() - started
        if watcher(conn, fleet) is not the_watcher:
            continue
        takes = sum(counter(worker, 'empty_takes') - before[worker.pid][1] for worker in waiters)
        # One turn per gap in all (and one under way for each waiter at the window's edges);
        # were every waiter to take again every half interval, it would be about 2 × 7 per second.
        assert takes <= elapsed / gap + len(waiters), (takes, elapsed)
        assert counter(the_watcher, 'claims') > before[the_watcher.pid][0]  # its refreshes
        assert all(counter(worker, 'claims') == before[worker.pid][0] for worker in waiters)
        return
    pytest.fail('the watch changed hands in three windows in a row')


def test_idle_workers_alone_on_one_queue_leave_the_wait_about_half_as_often_as_every_interval(
    conn, start_worker
) -> None:
    """Workers on one queue wait in RQ's BLMOVE; the winner of its sweep ticket goes back to RQ's
    loop each interval (to sweep it), the others every two intervals; a killed sweeper is replaced."""
    fleet = [start_worker('fleet-one', worker_class=COUNTING, env={'RQ_EPOCH_SWEEP_INTERVAL': '1'}) for _ in range(4)]
    wait_for(lambda: conn.scard(keys.workers_key()) == len(fleet), 60, what='4 workers registered')
    wait_for(lambda: all(counter(worker, 'blocking_moves') for worker in fleet), 30, what='every worker waiting')

    def sweeps() -> int:
        return int(conn.hget(keys.tickets_key(), 'count:fleet-one') or 0)

    before = {worker.pid: counter(worker, 'blocking_moves') for worker in fleet}
    first = sweeps()
    wait_for(lambda: sweeps() >= first + 8, 60, what='eight more sweeps of the queue')
    moves = {worker.pid: counter(worker, 'blocking_moves') - before[worker.pid] for worker in fleet}
    swept = sweeps() - first
    # Each sweep is one worker's turn in RQ's loop; the others wait two intervals at a time.
    # Were every worker to go back each interval, the fleet would make about 4 × 8 moves.
    # (The ticket may pass from one worker to another: only the fleet's total is bounded.)
    assert sum(moves.values()) <= 0.8 * len(fleet) * swept, (moves, swept)
    sweeper_pid = max(moves, key=lambda pid: moves[pid])

    # The sweeper killed: another worker sweeps the queue within two intervals.
    next(worker for worker in fleet if worker.pid == sweeper_pid).kill()
    killed = sweeps()
    wait_for(lambda: sweeps() >= killed + 3, 30, what='the queue swept again')
    job = Queue('fleet-one', connection=conn).enqueue('tests.jobs.add', 1, 2)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the job done')


def test_a_busy_fleet_asks_for_sweep_tickets_about_twice_per_interval_however_many_workers(
    conn, start_worker, tmp_path
) -> None:
    """Ten workers kept busy on several queues pass through RQ's loop between jobs: the one that
    swept last asks for the tickets again each interval, the others at their turns, one turn
    per interval for the whole fleet. About two asks per interval; were each worker to ask
    every two intervals, ten would make about six. Every queue is still swept each interval."""
    fleet = start_fleet(start_worker, conn, 10, {'RQ_EPOCH_SWEEP_INTERVAL': '1'})
    queues = [Queue(name, connection=conn) for name in QUEUES]
    log = str(tmp_path / 'runs.log')
    for i in range(600):
        queues[i % len(queues)].enqueue('tests.jobs.sleep_and_record', log, str(i), 0.2)

    def asks() -> int:
        return sum(counter(worker, 'ticket_asks') for worker in fleet)

    def swept() -> dict[str, int]:
        return {name: int(conn.hget(keys.tickets_key(), f'count:{name}') or 0) for name in QUEUES}

    def all_busy() -> bool:
        names = conn.smembers(keys.workers_key())
        return len(names) == len(fleet) and all(conn.hget(name, 'state') == b'busy' for name in names)

    wait_for(all_busy, 60, what='every worker busy')
    time.sleep(3.0)  # every worker has asked once and been given its turn (the window starts after)
    first_asks, first_swept, started = asks(), swept(), time.monotonic()
    time.sleep(5.0)
    last_asks, last_swept, elapsed = asks(), swept(), time.monotonic() - started
    assert sum(len(queue) for queue in queues) >= len(fleet), 'the fleet ran out of jobs in the window'
    made = last_asks - first_asks
    assert made <= 3 * elapsed + 2, (made, elapsed)
    assert all(last_swept[name] - first_swept[name] >= elapsed / 2 for name in QUEUES), (first_swept, last_swept)


def test_a_job_starts_within_a_sweep_interval_after_the_idle_watcher_is_killed(conn, start_worker) -> None:
    interval = 3
    fleet = start_fleet(start_worker, conn, 3, {'RQ_EPOCH_SWEEP_INTERVAL': str(interval)})
    dead = watcher(conn, fleet)
    dead.kill()
    job = Queue(QUEUES[2], connection=conn).enqueue('tests.jobs.add', 1, 2)
    # The watch expires within half an interval, and a waiter takes within another half;
    # the margin covers the start of the job's work-horse on a busy machine.
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, interval + 10, what='the job done')
    # And another worker takes over the watch once the dead one's expires.
    wait_for(
        lambda: conn.get(keys.watch_key(SET_ID)) not in (None, name_of(conn, dead)),
        2 * interval + 10,
        what='a new watcher',
    )


@pytest.mark.parametrize('others', [1, 2])
def test_a_job_starts_within_about_a_sweep_interval_after_the_watcher_and_other_idle_workers_are_killed(
    conn, start_worker, others: int
) -> None:
    """The watcher and ``others`` more idle workers SIGKILLed together (perhaps the waiters
    whose turns came next): one of those left takes the watch over within the watch's TTL
    and one turn more than were killed (one sweep interval when one other was killed; a
    quarter more when two were), not at the end of a long wait."""
    interval = 4  # the watch's TTL 2 s, a turn every second
    fleet = start_fleet(start_worker, conn, 4, {'RQ_EPOCH_SWEEP_INTERVAL': str(interval)})
    wait_for(lambda: all(counter(worker, 'empty_takes') for worker in fleet), 30, what='every worker waiting')
    the_watcher = watcher(conn, fleet)
    waiters = [worker for worker in fleet if worker is not the_watcher]
    killed = [the_watcher, *waiters[:others]]
    for worker in killed:
        worker.proc.send_signal(signal.SIGKILL)
    for worker in killed:
        worker.proc.wait(10)
    job = Queue(QUEUES[0], connection=conn).enqueue('tests.jobs.add', 1, 2)
    bound = interval / 2 + (others + 1) * interval / 4
    # The margin is for a busy machine's fork of the work-horse, and far below the 30 s that
    # waiters used to block.
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, bound + 6, what='the job done')
    left = waiters[others:]
    assert conn.hget(keys.job_key(job.id), 'worker_name') in {name_of(conn, worker) for worker in left}
    assert all(worker.proc.poll() is None for worker in left)


def name_of(conn: redis.Redis, worker: WorkerProcess) -> bytes | None:
    """The name of a worker process (registered, even after it died)."""
    for key in conn.smembers(keys.workers_key()):
        if int(conn.hget(key, 'pid') or 0) == worker.pid:
            return key.decode().rsplit(':', 1)[-1].encode()
    return None


def test_an_idle_fleet_rides_through_a_restart(conn, server, start_worker) -> None:
    fleet = start_fleet(start_worker, conn, 4, {})
    before = sum(counter(worker, 'wakeups') for worker in fleet)
    server.restart(down_for=1.0)
    client = server.client()
    jobs = [Queue(name, connection=client).enqueue('tests.jobs.add', 1, i) for i, name in enumerate(QUEUES * 2)]
    for job in jobs:
        wait_for(lambda job=job: job.get_status(refresh=True) == JobStatus.FINISHED, 60, what='every job done')
    assert all(worker.proc.poll() is None for worker in fleet)
    # No storm when the server came back: each job wakes at most two workers.
    assert sum(counter(worker, 'wakeups') for worker in fleet) - before <= 2 * len(jobs)
    client.close()


def test_each_queue_is_swept_about_once_per_interval_by_four_workers(conn, start_worker) -> None:
    interval = 1  # the fixture's
    fleet = start_fleet(start_worker, conn, 4, {})

    def granted() -> dict[str, int]:
        return {name: int(conn.hget(keys.tickets_key(), f'count:{name}') or 0) for name in QUEUES}

    def server_seconds() -> float:
        seconds, micros = conn.time()
        return seconds + micros / 1e6

    wait_for(lambda: all(granted().values()), 30, what='every queue swept once')
    first, started = granted(), server_seconds()
    wait_for(lambda: server_seconds() - started >= 6, 30, interval=0.2, what='six seconds of server time')
    last, elapsed = granted(), server_seconds() - started
    for name in QUEUES:
        sweeps = last[name] - first[name]
        # One ticket per queue per interval (less a tenth), fleet-wide; without the ticket
        # every worker would sweep every queue: 4 per interval.
        assert 1 <= sweeps <= elapsed / (0.9 * interval) + 1, (name, sweeps, elapsed)
    assert all(worker.proc.poll() is None for worker in fleet)


def test_rq_epoch_sweep_judges_whenever_asked(conn) -> None:
    """The cron sweep takes no ticket: right after a worker's ticket, it still judges."""
    from rq_epoch import Sweeper
    from rq_epoch.worker.tickets import take_tickets

    assert take_tickets(conn, ['fleet-cron'], 60).granted == ('fleet-cron',)
    assert take_tickets(conn, ['fleet-cron'], 60).granted == ()
    report = Sweeper(conn).sweep(['fleet-cron'])
    assert report.queues == ['fleet-cron']


def test_a_worker_started_while_writes_are_refused_waits_and_then_works(conn, server, start_worker) -> None:
    """``rq worker`` started while the primary answers NOREPLICAS (min-replicas-to-write, no replica)."""
    conn.config_set('min-replicas-to-write', 1)
    try:
        worker = start_worker(*QUEUES, env={'RQ_EPOCH_STARTUP_WAIT': '120'})
        wait_for(lambda: 'waiting for it' in worker.output(), 60, what='the worker waiting for the server')
        assert 'NOREPLICAS' in worker.output()
        assert worker.proc.poll() is None
    finally:
        conn.config_set('min-replicas-to-write', 0)
    job = Queue(QUEUES[0], connection=conn).enqueue('tests.jobs.add', 2, 2)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 60, what='the job done')
    assert worker.proc.poll() is None
    assert 'the server is back' in worker.output()
    assert worker.output().count('waiting for it') == 1


def test_the_startup_wait_is_bounded(conn, start_worker) -> None:
    conn.config_set('min-replicas-to-write', 1)
    try:
        worker = start_worker(*QUEUES, env={'RQ_EPOCH_STARTUP_WAIT': '1'})
        assert worker.proc.wait(60) != 0
        assert 'waiting for it' in worker.output()
        assert 'did not come back within 1s' in worker.output()
    finally:
        conn.config_set('min-replicas-to-write', 0)


def test_a_wrong_password_is_not_waited_for(conn: redis.Redis, server) -> None:
    """The start-up wait rides out outages only: a refused password fails at once."""
    conn.config_set('requirepass', 'the-password')  # this connection stays authenticated
    wrong = redis.Redis(host='127.0.0.1', port=server.port, password='not-the-password')
    started = time.monotonic()
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            wait_while_unavailable(wrong.ping, limit=60, log=logging.getLogger('rq_epoch'), name='test')
    finally:
        conn.config_set('requirepass', '')
        wrong.close()
    assert time.monotonic() - started < 30  # not the 60 s limit: nothing was waited for
