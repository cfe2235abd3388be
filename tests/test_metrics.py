"""Prometheus metrics: the real endpoint scraped over HTTP on loopback, in states built by real workers."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rq.executions import Execution
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.metrics import LEASE_STATES, ROUND_TRIPS, SWEPT_VERDICTS, EpochCollector, epoch_age, serve
from rq_epoch.protocol import keys
from rq_epoch.protocol.server import read_primary_state
from rq_epoch.worker.stopping import hand_back, mark_stopping
from tests.conftest import ROOT, thaw, wait_for
from tests.leases import CURRENT, OTHER_EPOCH, current_run_id, start_job
from tests.test_cli import snapshot

RQ_EPOCH = [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()']
#: Restart grace of the workers and of the exporter in the scenario: long enough for the
#: test to look at a deferred lease after a restart, short enough to wait for.
GRACE = 20

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, keyed by name and sorted labels."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers['Content-Type'].startswith('text/plain')
        return response.read().decode()


def scrape_up(url: str) -> tuple[str, Samples]:
    """Scrape until the exporter reads the server (it says rq_epoch_up 0 while it cannot)."""
    result: list[tuple[str, Samples]] = []

    def attempt() -> bool:
        text = get(url)
        samples = parse(text)
        result[:] = [(text, samples)]
        return value(samples, 'rq_epoch_up') == 1

    wait_for(attempt, 30, interval=0.2, what='a scrape that reads the server')
    return result[0]


class Tally:
    """Round trips and commands sent by a client (see :func:`counting_client`)."""

    def __init__(self) -> None:
        self.round_trips = 0
        self.commands: list[str] = []

    def reset(self) -> None:
        self.round_trips = 0
        self.commands = []


def counting_client(server: EmbeddedServer, tally: Tally) -> redis.Redis:
    """A real client whose connections count every write to the socket (one per round trip)."""

    def name(args: tuple[Any, ...]) -> str:
        first = args[0]
        return (first.decode() if isinstance(first, bytes) else str(first)).split()[0].upper()

    class CountingConnection(redis.connection.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            tally.round_trips += 1
            super().send_packed_command(command, check_health)

        def send_command(self, *args: Any, **kwargs: Any) -> None:
            tally.commands.append(name(args))
            super().send_command(*args, **kwargs)

        def pack_commands(self, commands: Any) -> Any:
            tally.commands.extend(name(tuple(args)) for args in commands)
            return super().pack_commands(commands)

    pool = redis.ConnectionPool(connection_class=CountingConnection, host='127.0.0.1', port=server.port)
    return redis.Redis(connection_pool=pool)


#: Wildcard addresses, and the loopback address the tests reach them through.
THROUGH_LOOPBACK = {'0.0.0.0': '127.0.0.1', '[::]': '[::1]'}


def loopback_url(url: str) -> str:
    """``url`` with a wildcard host (``0.0.0.0``, ``[::]``) replaced by loopback: tests connect to loopback only."""
    scheme, _, rest = url.partition('://')
    host, colon, tail = rest.rpartition(':')
    return f'{scheme}://{THROUGH_LOOPBACK.get(host, host)}{colon}{tail}'


class ExporterProcess:
    """``rq-epoch exporter`` as a real process, on a port it picks.

    Its output is read as it comes (:meth:`line`): the first line names the metrics' address
    (:attr:`url`, reached through loopback when the exporter listens on a wildcard).
    """

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
        environ['PYTHONPATH'] = str(ROOT) + os.pathsep + environ.get('PYTHONPATH', '')
        environ['PYTHONUNBUFFERED'] = '1'
        environ.update(env or {})
        self.proc = subprocess.Popen(
            [*RQ_EPOCH, 'exporter', '--port', '0', *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=environ,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self._lines.put), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._err.append), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.banner = self.line()
        assert self.banner.startswith('rq-epoch exporter: serving http://'), self.banner
        self.url = loopback_url(self.banner.split()[3])

    @staticmethod
    def _read(stream: Any, keep: Callable[[str], Any]) -> None:
        for line in stream:
            keep(line)

    def line(self, timeout: float = 30) -> str:
        """The next line the exporter printed on stdout (waits up to ``timeout`` seconds)."""
        try:
            return self._lines.get(timeout=timeout).strip()
        except queue.Empty:
            raise AssertionError(f'the exporter printed no line within {timeout} s') from None

    def stop(self) -> tuple[int, str]:
        """SIGTERM, and the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        for reader in self._readers:
            reader.join(15)
        return self.proc.returncode, ''.join(self._err)


@pytest.fixture
def start_exporter() -> Iterator[Callable[..., ExporterProcess]]:
    started: list[ExporterProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ExporterProcess:
        exporter = ExporterProcess(list(args), env)
        started.append(exporter)
        return exporter

    yield start
    for exporter in started:
        exporter.stop()


def lease_of(conn: redis.Redis, queue: str, job_id: str) -> tuple[bytes, float] | None:
    score = conn.zscore(keys.leases_key(queue), job_id)
    return None if score is None else (job_id.encode(), score)


def server_now(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def run_job(start_worker: Callable[..., Any], conn: redis.Redis, queue: Queue, job: Job, **env: str) -> Any:
    """Start a worker on the queue and wait until it runs ``job`` (the only job waiting)."""
    # A 5 s lease (1 s heartbeat + 4 s margin), so that a busy machine does not make a live one expire.
    settings = {'RQ_EPOCH_RESTART_GRACE': str(GRACE), 'RQ_EPOCH_LEASE_MARGIN': '4'}
    worker = start_worker(queue.name, env={**settings, **env})
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 60, what=f'job {job.id} running')
    wait_for(lambda: lease_of(conn, queue.name, job.id), 10, what=f'lease of {job.id}')
    return worker


def check_mon(samples: Samples, *, verdicts: dict[str, int], leases: dict[str, int], dead: int, stalled: int) -> None:
    got_verdicts = {v: value(samples, 'rq_epoch_sweep_verdicts_total', queue='mon', verdict=v) for v in SWEPT_VERDICTS}
    assert got_verdicts == {v: verdicts.get(v, 0) for v in SWEPT_VERDICTS}
    got_leases = {s: value(samples, 'rq_epoch_leases', queue='mon', state=s) for s in LEASE_STATES}
    assert got_leases == {s: leases.get(s, 0) for s in LEASE_STATES}
    assert value(samples, 'rq_epoch_dead_letters', queue='mon') == dead
    assert value(samples, 'rq_epoch_stalled_jobs', queue='mon') == stalled
    assert value(samples, 'rq_epoch_stock_leases', queue='mon') == 0
    assert value(samples, 'rq_epoch_stale_outcomes_refused_total', queue='mon') == 0
    assert value(samples, 'rq_epoch_scrape_truncated', queue='mon') == 0


@pytest.mark.slow
def test_scrape_matches_a_state_built_by_real_workers(
    conn: redis.Redis, server: EmbeddedServer, start_worker: Callable[..., Any], start_exporter, tmp_path: Path
) -> None:
    queue = Queue('mon', connection=conn)
    log, release = str(tmp_path / 'log'), str(tmp_path / 'release')
    exporter = start_exporter('--url', server.url, '--grace', str(GRACE))
    tally = Tally()
    counted = EpochCollector(counting_client(server, tally), restart_grace=GRACE)
    httpd, thread = serve(counted, '127.0.0.1', 0)
    in_process = f'http://127.0.0.1:{httpd.server_port}/metrics'
    try:
        # Two jobs running under live workers; three more whose workers will go away.
        running = []
        for tag in ('a', 'b'):
            job = queue.enqueue('tests.jobs.wait_for_file_then_record', log, tag, release)
            run_job(start_worker, conn, queue, job)
            running.append(job)
        recovered = queue.enqueue('tests.jobs.wait_for_file_then_record', log, 'c', release, max_stalled=3)
        killed = [run_job(start_worker, conn, queue, recovered)]
        dead = queue.enqueue('tests.jobs.wait_for_file_then_record', log, 'd', release, max_stalled=1)
        killed.append(run_job(start_worker, conn, queue, dead))
        crossed = queue.enqueue('tests.jobs.wait_for_file_then_record', log, 'e', release, max_stalled=1)
        crossing_worker = run_job(start_worker, conn, queue, crossed)

        # SIGKILL two workers: the live workers' own sweeps count both stalls.
        for worker in killed:
            worker.kill()
        wait_for(
            lambda: (
                recovered.get_status(refresh=True) == JobStatus.QUEUED
                and dead.get_status(refresh=True) == JobStatus.FAILED
                and conn.zcard(keys.finishing_key()) == 0
            ),
            60,
            what='one stall recovered, one dead-lettered and finished',
        )
        _, before_restart = scrape_up(exporter.url)
        check_mon(
            before_restart,
            verdicts={'recovered': 1, 'dead': 1},
            leases={'live': 3},
            dead=1,
            stalled=1,
        )

        # A restart while the third worker is gone: its lease crosses into a new epoch.
        old = server.run_id()
        server.stop()
        crossing_worker.kill()
        server.start()
        conn = server.client()
        new = server.run_id()
        assert new != old
        started_at = server_now(conn)

        def deferred_state() -> bool:
            for job in running:  # the live workers re-stamped theirs
                lease = lease_of(conn, 'mon', job.id)
                if conn.hget(job.key, 'lease_epoch') != new.encode() or not lease or lease[1] <= server_now(conn):
                    return False
            lease = lease_of(conn, 'mon', crossed.id)
            return bool(lease) and lease[1] <= server_now(conn)

        wait_for(deferred_state, 30, what='running leases re-stamped, the crossed lease expired')
        grace_text, during_grace = scrape_up(exporter.url)
        age = value(during_grace, 'rq_epoch_epoch_age_seconds')
        assert age < GRACE
        assert value(during_grace, 'rq_epoch_restart_grace_remaining_seconds') == GRACE - age
        assert value(during_grace, 'rq_epoch_server_info', run_id=new, role='master') == 1
        check_mon(
            during_grace,
            verdicts={'recovered': 1, 'dead': 1},
            leases={'live': 2, 'deferred': 1},
            dead=1,
            stalled=1,
        )
        assert Job.fetch(crossed.id, connection=conn).get_status() == JobStatus.STARTED

        # After the grace, a live worker's sweep requeues the crossed lease uncounted.
        wait_for(
            lambda: crossed.get_status(refresh=True) == JobStatus.QUEUED,
            GRACE + 30,
            what='the crossed lease requeued after the grace',
        )
        crossed_job = Job.fetch(crossed.id, connection=conn)
        assert (crossed_job.stalled, crossed_job.exempt_recoveries) == (0, 1)

        # And a stock RQ worker on another queue, as in a rolling upgrade.
        legacy = Queue('legacy', connection=conn)
        held = legacy.enqueue('tests.jobs.wait_for_file_then_record', log, 's', release)
        start_worker('legacy', worker_class=None)
        wait_for(lambda: held.get_status(refresh=True) == JobStatus.STARTED, 60, what='stock worker running its job')

        text, after = scrape_up(exporter.url)
        assert value(after, 'rq_epoch_server_info', run_id=new, role='master') == 1
        assert value(after, 'rq_epoch_epoch_age_seconds') >= GRACE
        assert value(after, 'rq_epoch_restart_grace_remaining_seconds') == 0
        check_mon(
            after,
            verdicts={'exempt': 1, 'recovered': 1, 'dead': 1},
            leases={'live': 2},
            dead=1,
            stalled=1,
        )
        assert started_at <= value(after, 'rq_epoch_last_sweep_timestamp_seconds', queue='mon') <= server_now(conn)
        assert value(after, 'rq_epoch_stock_leases', queue='legacy') == 1
        assert value(after, 'rq_epoch_last_sweep_timestamp_seconds', queue='legacy') == 0  # no rq-epoch sweep there
        assert {labels for name, labels in after if name == 'rq_epoch_dead_letters'} == {
            (('queue', 'legacy'),),
            (('queue', 'mon'),),
        }

        # The collector an application registers reads the same, in a fixed number of round trips.
        scrape_up(in_process)  # a first scrape opens the connection (the restart closed the old one)
        tally.reset()
        mine = parse(get(in_process))
        assert tally.round_trips == ROUND_TRIPS
        assert not {'SCAN', 'KEYS'} & set(tally.commands)
        moving = {'rq_epoch_epoch_age_seconds', 'rq_epoch_last_sweep_timestamp_seconds'}
        assert {k: v for k, v in mine.items() if k[0] not in moving} == {
            k: v for k, v in after.items() if k[0] not in moving
        }
        shown = ('rq_epoch_epoch_age', 'rq_epoch_restart_grace', 'rq_epoch_leases{queue="mon"')
        deferred_lines = '\n'.join(line for line in grace_text.splitlines() if line.startswith(shown))
        print(f'\n--- during the restart grace ({server.kind}) ---\n{deferred_lines}')
        print(f'--- scrape of the test state ({server.kind}), {tally.round_trips} round trips ---\n{text}')
    finally:
        httpd.shutdown()
        thread.join(10)
        Path(release).touch()


def test_a_refused_stale_outcome_is_counted_in_the_scrape(
    server: EmbeddedServer, conn: redis.Redis, start_worker: Callable[..., Any], start_exporter, tmp_path: Path
) -> None:
    """A worker frozen past its lease: a sweep hands the job on, and the stale outcome is refused."""
    log, release = tmp_path / 'runs', tmp_path / 'release'
    job = Queue('fence', connection=conn).enqueue('tests.jobs.gated', str(log), 'f', str(release), max_stalled=3)
    stale = start_worker('fence')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    horses = wait_for(stale.horse_pids, 10, what='work-horse')
    frozen = [stale.pid, *horses]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        release.touch()
        start_worker('fence')  # sweeps every second: takes the expired lease, reruns the job
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='the newer run finishing')
        for pid in horses:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: conn.hget(keys.stats_key('fence'), 'refused') == b'1', 20, what='the stale outcome refused')
    finally:
        thaw(frozen)
    exporter = start_exporter('--url', server.url)
    _, samples = scrape_up(exporter.url)
    assert value(samples, 'rq_epoch_stale_outcomes_refused_total', queue='fence') == 1
    assert value(samples, 'rq_epoch_sweep_verdicts_total', queue='fence', verdict='recovered') == 1
    assert value(samples, 'rq_epoch_stalled_jobs', queue='fence') == 0  # finished: no longer waiting or running


def fill(conn: redis.Redis, queues: int, per_queue: int) -> None:
    """Leases, recoveries, dead letters and waiting jobs in many queues."""
    for q in range(queues):
        queue = Queue(f'q{q}', connection=conn)
        for i in range(per_queue):
            kind = i % 5
            if kind == 0:
                start_job(conn, queue, epoch=CURRENT, expired=False)
            elif kind == 1:
                start_job(conn, queue, epoch=OTHER_EPOCH)
            elif kind == 2:
                start_job(conn, queue, epoch=CURRENT, max_stalled=5)
            elif kind == 3:
                start_job(conn, queue, epoch=CURRENT, max_stalled=1)
            else:
                queue.enqueue('tests.jobs.add', 1, 2)
        Sweeper(conn, restart_grace=0).sweep([queue.name])


def test_a_scrape_costs_the_same_round_trips_whatever_the_queues_and_jobs(
    conn: redis.Redis, server: EmbeddedServer
) -> None:
    tally = Tally()
    client = counting_client(server, tally)
    registry = CollectorRegistry()
    registry.register(EpochCollector(client, restart_grace=0))
    assert tally.round_trips == 0  # registering reads nothing

    def scrape() -> tuple[int, list[str], Samples]:
        generate_latest(registry)  # opens the connection
        tally.reset()
        samples = parse(generate_latest(registry).decode())
        return tally.round_trips, list(tally.commands), samples

    none, _, empty = scrape()
    assert none == ROUND_TRIPS - 2  # no queue: no per-queue read, no job read
    assert value(empty, 'rq_epoch_up') == 1

    fill(conn, queues=1, per_queue=5)
    small, _, one = scrape()
    fill(conn, queues=30, per_queue=40)
    before = snapshot(conn)
    large, commands, many = scrape()

    assert small == large == ROUND_TRIPS
    assert not {'SCAN', 'KEYS'} & set(commands)
    assert set(commands) <= {
        'INFO',
        'TIME',
        'SMEMBERS',
        'HGETALL',
        'ZCARD',
        'ZCOUNT',
        'ZRANGE',
        'ZREVRANGE',
        'LLEN',
        'LRANGE',
        'HMGET',
    }
    assert snapshot(conn) == before  # a scrape writes nothing
    assert value(one, 'rq_epoch_sweep_verdicts_total', queue='q0', verdict='dead') == 1
    for q in range(30):  # the first 30 queues were filled twice over: q0 has 1 + 8 of each kind
        name = f'q{q}'
        each = 9 if q == 0 else 8
        assert value(many, 'rq_epoch_leases', queue=name, state='live') == each
        assert value(many, 'rq_epoch_dead_letters', queue=name) == each
        assert value(many, 'rq_epoch_stalled_jobs', queue=name) == each
        assert value(many, 'rq_epoch_sweep_verdicts_total', queue=name, verdict='exempt') == each
        assert value(many, 'rq_epoch_sweep_verdicts_total', queue=name, verdict='recovered') == each


def test_scan_limit_marks_a_queue_truncated(conn: redis.Redis) -> None:
    queue = Queue('big', connection=conn)
    for _ in range(6):
        start_job(conn, queue, epoch=CURRENT)
    samples = parse(generate_latest(_registry(EpochCollector(conn, restart_grace=0, scan_limit=4))).decode())
    assert value(samples, 'rq_epoch_scrape_truncated', queue='big') == 1
    assert value(samples, 'rq_epoch_leases', queue='big', state='expired-counted') == 4  # a lower bound
    samples = parse(generate_latest(_registry(EpochCollector(conn, restart_grace=0, scan_limit=6))).decode())
    assert value(samples, 'rq_epoch_scrape_truncated', queue='big') == 0
    assert value(samples, 'rq_epoch_leases', queue='big', state='expired-counted') == 6


def _registry(collector: EpochCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_lease_states_follow_the_sweep_rule(conn: redis.Redis) -> None:
    queue = Queue('states', connection=conn)
    start_job(conn, queue, epoch=CURRENT, expired=False)
    start_job(conn, queue, epoch=CURRENT)
    start_job(conn, queue, epoch=OTHER_EPOCH)
    start_job(conn, queue, epoch=None)
    finished, _ = start_job(conn, queue, epoch=CURRENT)
    conn.hset(finished.key, 'status', 'finished')
    gone, _ = start_job(conn, queue, epoch=CURRENT)
    conn.delete(gone.key)
    conn.zadd(keys.leases_key('states'), {'mal:formed': 0})  # a job id has no colon
    # Stamped by an earlier process that was seen serving after the deadline: counted, never deferred.
    start_job(conn, queue, epoch='a' * 40)
    seconds, micros = conn.time()
    now = seconds + micros / 1e6
    conn.hset(keys.alive_key(), 'a' * 40, f'{now - 0.5:.6f} {"b" * 40} {now - 100:.6f}')
    # Stamped by this process, but its worker was told to stop and its lease ran out within the
    # stop window (verdict stopping): uncounted, and not deferred.
    stopped, _ = start_job(conn, queue, epoch=CURRENT, expired=False)
    mark = mark_stopping(conn, stopped, Execution(str(stopped.lease_execution), stopped.id, connection=conn), 60)
    wait_for(lambda: _server_now(conn) > mark.marked_at + 0.01, 5, interval=0.005)
    conn.zadd(keys.leases_key('states'), {stopped.id: mark.marked_at + 0.01}, xx=True)

    def states(grace: int) -> dict[str, float]:
        samples = parse(
            generate_latest(_registry(EpochCollector(conn, restart_grace=grace, queues=['states']))).decode()
        )
        return {s: value(samples, 'rq_epoch_leases', queue='states', state=s) for s in LEASE_STATES}

    expected = {'live': 1, 'expired-counted': 2, 'expired-uncounted': 3, 'deferred': 0, 'expired-stale': 3}
    assert states(0) == expected
    assert states(10**6) == expected | {'expired-uncounted': 1, 'deferred': 2}
    # The sweep agrees, lease by lease.
    report = Sweeper(conn, restart_grace=0, max_stalled=3).sweep(['states'])
    assert sorted(v.verdict for v in report.verdicts) == sorted(
        ['recovered', 'recovered', 'exempt', 'exempt', 'stopping', 'settled', 'ghost', 'corrupt']
    )


def _server_now(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def test_jobs_handed_back_are_counted_per_queue(conn: redis.Redis) -> None:
    queue = Queue('deploys', connection=conn)
    job, _ = start_job(conn, queue, expired=False)
    assert hand_back(conn, job, Execution(str(job.lease_execution), job.id, connection=conn)).handed_back
    samples = parse(generate_latest(_registry(EpochCollector(conn, queues=['deploys']))).decode())
    assert value(samples, 'rq_epoch_handed_back_total', queue='deploys') == 1
    assert value(samples, 'rq_epoch_sweep_verdicts_total', queue='deploys', verdict='stopping') == 0


def test_refused_outcomes_and_last_sweep_come_from_the_stats_hash(conn: redis.Redis) -> None:
    queue = Queue('fence', connection=conn)
    start_job(conn, queue, epoch=CURRENT, expired=False)
    samples = parse(generate_latest(_registry(EpochCollector(conn))).decode())
    assert value(samples, 'rq_epoch_stale_outcomes_refused_total', queue='fence') == 0
    assert value(samples, 'rq_epoch_last_sweep_timestamp_seconds', queue='fence') == 0

    Sweeper(conn).sweep(['fence'], dry_run=True)
    assert conn.hget(keys.stats_key('fence'), 'last_sweep') is None  # a dry run writes nothing
    before = server_now(conn)
    Sweeper(conn).sweep(['fence'])
    stamp = float(conn.hget(keys.stats_key('fence'), 'last_sweep'))
    assert before <= stamp <= server_now(conn)
    conn.hincrby(keys.stats_key('fence'), 'refused', 3)  # the field the commit script counts refusals in
    samples = parse(generate_latest(_registry(EpochCollector(conn))).decode())
    assert value(samples, 'rq_epoch_stale_outcomes_refused_total', queue='fence') == 3
    assert value(samples, 'rq_epoch_last_sweep_timestamp_seconds', queue='fence') == pytest.approx(stamp)


def test_epoch_age_and_grace_remaining_come_from_one_function(conn: redis.Redis) -> None:
    Sweeper(conn).sweep(['age'])  # records this process as primary, as any sweep does
    collector = EpochCollector(conn, restart_grace=10**6)
    snap = collector.snapshot()
    state = read_primary_state(conn)
    assert state.first_seen > 0
    assert abs(snap.age - epoch_age(state)) <= 1
    assert snap.age <= snap.server.uptime
    assert snap.grace_remaining == 10**6 - snap.age


def test_exporter_serves_only_given_queues_reports_a_lost_server_and_stops_on_sigterm(
    server: EmbeddedServer, conn: redis.Redis, start_exporter
) -> None:
    start_job(conn, Queue('one', connection=conn), epoch=CURRENT, expired=False)
    start_job(conn, Queue('two', connection=conn), epoch=CURRENT, expired=False)
    exporter = start_exporter('--url', server.url, '-q', 'one')
    assert exporter.banner.endswith('(one)')
    _, samples = scrape_up(exporter.url)
    assert value(samples, 'rq_epoch_leases', queue='one', state='live') == 1
    assert not any(dict(labels).get('queue') == 'two' for _, labels in samples)

    everything = start_exporter('--url', server.url, '--all')  # --all: rq:queues, read at each scrape
    start_job(conn, Queue('three', connection=conn), epoch=CURRENT, expired=False)
    _, samples = scrape_up(everything.url)
    assert {dict(labels)['queue'] for name, labels in samples if name == 'rq_epoch_stalled_jobs'} == {
        'one',
        'two',
        'three',
    }

    server.stop()
    try:
        for _ in range(2):  # the endpoint keeps answering, and logs the reason once
            down = parse(get(exporter.url))
            assert down == {('rq_epoch_up', ()): 0}
    finally:
        server.start()
    scrape_up(exporter.url)
    code, err = exporter.stop()
    assert code == 0
    assert err.count('metrics: cannot read the server') == 1


def test_exporter_without_prometheus_client_says_what_to_install(server: EmbeddedServer) -> None:
    block = "import sys; sys.modules['prometheus_client'] = None; import rq_epoch.ops.metrics; "
    out = subprocess.run(
        [sys.executable, '-c', block + 'from rq_epoch.ops.cli import main; main()', 'exporter', '--url', server.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 1
    assert (
        out.stderr.strip() == "Error: the Prometheus metrics need prometheus-client: pip install 'rq-epoch[prometheus]'"
    )


def test_the_epoch_in_the_scrape_is_the_servers(conn: redis.Redis) -> None:
    samples = parse(generate_latest(_registry(EpochCollector(conn))).decode())
    assert value(samples, 'rq_epoch_server_info', run_id=current_run_id(conn), role='master') == 1
