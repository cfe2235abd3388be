"""A Sentinel failover costs a running job nothing: real workers, real sentinels, real signals.

Each test starts its own topology (``tests/sentinel.py``: a primary, replicas, three
sentinels on loopback) and real ``rq worker -c <settings> --worker-class rq_epoch.Worker``
processes whose settings module has RQ's ``SENTINEL`` dict, plus a cron-like sweeper that
connects through the sentinels afresh every half second. Heartbeat 1 s, lease margin 2 s,
restart grace 4 s. The seconds a worker took to reach the new primary are printed (``-s``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq.command import PUBSUB_CHANNEL_TEMPLATE, send_shutdown_command
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import ROOT, SERVER_KINDS, WorkerProcess, wait_for
from tests.sentinel import MASTER_NAME, SentinelTopology, close_sentinel, sentinel_available

pytestmark = pytest.mark.sentinel

WORKER_ENV = {
    'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
    'RQ_EPOCH_LEASE_MARGIN': '2',
    'RQ_EPOCH_SWEEP_INTERVAL': '1',
    'RQ_EPOCH_RESTART_GRACE': '4',
}
GRACE = 4


def _topology(kind: str, base: Path, **kwargs: object) -> SentinelTopology:
    if not sentinel_available(kind):
        if os.environ.get('CI'):
            pytest.fail(f'CI runs the failover tests: {kind}-server cannot run as a sentinel here')
        pytest.skip(f'{kind}-server cannot run as a sentinel here')
    return SentinelTopology(base, kind, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=SERVER_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Fleet:
    """A topology, the workers started on it, and a cron-like sweeper thread."""

    def __init__(self, topology: SentinelTopology, tmp_path: Path) -> None:
        self.topology = topology
        self.tmp_path = tmp_path
        self.settings = topology.settings_module(tmp_path / 'settings')
        self.workers: list[WorkerProcess] = []
        self.verdicts: list[tuple[int, str, str, int]] = []  # (port, job id, verdict, stalled)
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def worker(
        self, *queues: str, env: dict[str, str] | None = None, worker_class: str = 'rq_epoch.Worker'
    ) -> WorkerProcess:
        environ = dict(os.environ)
        environ['PYTHONPATH'] = str(ROOT) + os.pathsep + environ.get('PYTHONPATH', '')
        environ.update({**WORKER_ENV, 'PYTHONUNBUFFERED': '1', **(env or {})})
        log = self.tmp_path / f'worker-{len(self.workers)}.log'
        argv = [
            sys.executable, '-m', 'rq.cli', 'worker', '-c', self.settings, '-P', str(self.tmp_path / 'settings'),
            '--worker-class', worker_class, '--job-monitoring-interval', '1', *queues,
        ]  # fmt: skip
        with open(log, 'wb') as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=environ)
        worker = WorkerProcess(proc, log)
        self.workers.append(worker)
        return worker

    def cron(self, *queues: str, every: float = 0.5) -> None:
        """Sweep like a cron job: a fresh connection through the sentinels each time."""

        def run() -> None:
            deadline = time.monotonic() + 120
            while not self._stop.is_set() and time.monotonic() < deadline:
                sentinel = self.topology.sentinel()
                client = sentinel.master_for(MASTER_NAME, socket_timeout=2, socket_connect_timeout=2)
                try:
                    report = Sweeper(client, restart_grace=GRACE).sweep(list(queues))
                    port = int(client.connection_pool.get_master_address()[1])
                    self.verdicts.extend((port, v.job_id, v.verdict, v.stalled) for v in report.verdicts)
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    pass
                finally:
                    client.close()
                    close_sentinel(sentinel)
                self._stop.wait(every)

        self._sweeper = threading.Thread(target=run, daemon=True)
        self._sweeper.start()

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(10)
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.kill()


@pytest.fixture
def fleet(kind: str, tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(**kwargs: object) -> Fleet:
        topology = _topology(kind, tmp_path / 'topology', **kwargs)
        topology.start()
        made.append(Fleet(topology, tmp_path))
        return made[-1]

    yield make
    for f in made:
        f.close()
        f.topology.close()


def executions(log: Path, tag: str) -> tuple[int, int]:
    text = log.read_text() if log.exists() else ''
    return text.count(f'start {tag} '), text.count(f'end {tag} ')


def server_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of process ``pid`` (from /proc)."""
    inodes = set()
    for fd in Path(f'/proc/{pid}/fd').iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path(f'/proc/{pid}/net/tcp').read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == '01' and fields[9] in inodes:  # ESTABLISHED
            ports.add(int(fields[2].split(':')[1], 16))
    return ports


def lease_on(client: redis.Redis, job: Job, run_id: str) -> bool:
    return client.hget(job.key, 'lease_epoch') == run_id.encode() and client.hget(job.key, 'status') == b'started'


def moved_lines(worker: WorkerProcess) -> list[str]:
    return [line for line in worker.output().splitlines() if 'primary moved' in line]


def test_failover_mid_job_costs_nothing_and_the_worker_follows(fleet, tmp_path: Path) -> None:
    f = fleet()
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('fo', connection=client)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'j', 7)
    worker = f.worker('fo')
    f.cron('fo')
    wait_for(lambda: lease_on(client, job, old.run_id()), 30, what='job running, lease on the first primary')
    old_run_id = old.run_id()
    _, new = f.topology.failover()
    promoted = f.topology.promoted_at or time.monotonic()
    new_client, new_run_id = new.client(), new.run_id()
    wait_for(lambda: lease_on(new_client, job, new_run_id), 10, what='lease re-stamped on the new primary')
    reached = time.monotonic() - promoted
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 30, what='job finished')
    assert worker.proc.poll() is None
    job = Job.fetch(job.id, connection=new_client)
    assert executions(log, 'j') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert len(job.results()) == 1
    wait_for(lambda: new_client.zcard(keys.leases_key('fo')) == 0, 10, what='the lease removed on the new primary')
    assert not [v for v in f.verdicts if v[1] == job.id and v[2] != 'settled']
    lines = moved_lines(worker)
    assert len(lines) == 1 and old_run_id in lines[0] and new_run_id in lines[0], worker.output()
    assert f':{new.port} ' in lines[0] and f':{old.port} ' in lines[0]
    # Every connection of the worker is on the new primary (sentinels aside), its pubsub one too:
    # a command published there reaches it (the old primary is still a master of its own).
    # The pubsub thread subscribes again once it has reconnected, and while it is reconnecting
    # its connection shows on neither server: the command is sent once its channel has a
    # subscriber on the new primary (and none on the old one).
    ports = {p for p in server_ports(worker.pid) if p in (old.port, new.port)}
    assert ports == {new.port}
    channel = PUBSUB_CHANNEL_TEMPLATE % job.worker_name
    wait_for(lambda: new_client.pubsub_numsub(channel)[0][1] == 1, 15, what="the worker's channel on the new primary")
    assert client.pubsub_numsub(channel)[0][1] == 0
    assert f.topology.role(old) == 'master'
    send_shutdown_command(new_client, job.worker_name)
    try:
        wait_for(lambda: worker.proc.poll() is not None, 15, what='the worker to obey the command')
    except pytest.fail.Exception:
        pytest.fail(f'the worker did not obey a command sent on the new primary within 15 s:\n{worker.output()}')
    assert worker.proc.returncode == 0 and 'pubsub thread exiting' not in worker.output()
    print(f'\n[{f.topology.kind}] failover mid-job: worker re-stamped its lease on the new primary {reached:.2f}s '
          'after the promotion')  # fmt: skip


def test_worker_lost_then_failover_is_finished_once_by_another_worker_never_counted(fleet, tmp_path: Path) -> None:
    f = fleet()
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('lost', connection=client)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'k', 8, max_stalled=1)
    first = f.worker('lost')
    wait_for(lambda: lease_on(client, job, old.run_id()), 30, what='job running')
    wait_for(lambda: executions(log, 'k')[0] == 1, 30, what='job function running')  # the kill ends a run of it
    # Idle on the same queue, through the failover. Nothing sweeps the old primary between the
    # kill and the promotion: a failover slower than the lease (the sentinels may refuse it for
    # a while) would otherwise let a sweep there count the death, rightly, under the old epoch.
    second = f.worker('lost', env={'RQ_EPOCH_SWEEP_INTERVAL': '3600'})
    wait_for(lambda: 'ubscribing to channel' in second.output(), 30, what='the second worker up')
    first.kill()  # worker and work-horse: a machine lost
    assert executions(log, 'k') == (1, 0)  # killed mid-run
    _, new = f.topology.failover()
    new_client = new.client()
    assert new_client.hget(job.key, 'lease_epoch') == old.run_id().encode()  # crossed the failover
    f.cron('lost')
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 60, what='finished by the other worker')
    job = Job.fetch(job.id, connection=new_client)
    assert executions(log, 'k') == (2, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    assert job.worker_name and job.worker_name in second.output()
    assert len(job.results()) == 1
    assert job.id not in FailedJobRegistry('lost', connection=new_client)
    counted = [v for v in f.verdicts if v[1] == job.id and v[2] in ('recovered', 'dead')]
    assert counted == []
    stats = new_client.hgetall(keys.stats_key('lost'))
    assert b'recovered' not in stats and b'dead' not in stats
    assert 'verdict recovered' not in second.output() and 'verdict dead' not in second.output()
    assert len(moved_lines(second)) == 1


def test_worker_lost_lease_expired_then_failover_is_counted_by_the_promoted_replica(fleet, tmp_path: Path) -> None:
    """The old primary was seen alive after the lease ran out; the promoted replica, which has
    that record by replication, counts the death at once (no restart grace)."""
    from rq_epoch.protocol import epoch

    f = fleet()
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('gone', connection=client)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'g', str(tmp_path / 'never'), max_stalled=3)
    victim = f.worker('gone', env={'RQ_EPOCH_SWEEP_INTERVAL': '3600'})
    wait_for(lambda: executions(log, 'g')[0] == 1, 30, what='job function running')
    # A busy worker on another queue, sweeping never: its heartbeats note the primary alive.
    keep = Queue('keep', connection=client).enqueue(
        'tests.jobs.wait_for_file_then_record', str(tmp_path / 'keep-log'), 'k', str(tmp_path / 'keep-release')
    )
    f.worker('keep', env={'RQ_EPOCH_SWEEP_INTERVAL': '3600'})
    wait_for(lambda: keep.get_status(refresh=True) == JobStatus.STARTED, 30, what='the keeper job running')
    old_run_id = old.run_id()
    victim.kill()
    deadline = float(wait_for(lambda: client.zscore(keys.leases_key('gone'), job.id), 5, what='the lease'))
    replica = f.topology.replica.client()

    def proven_on_the_replica() -> bool:
        seen = epoch.parse_seen_alive(replica.hget(keys.alive_key(), old_run_id))
        return epoch.died_under(deadline, seen) and replica.zscore(keys.leases_key('gone'), job.id) == deadline

    wait_for(proven_on_the_replica, 20, what='the replica to hold the record of life past the deadline')
    _, new = f.topology.failover()
    new_client = new.client()
    assert new_client.hget(job.key, 'lease_epoch') == old_run_id.encode()
    report = Sweeper(new_client, restart_grace=3600).sweep(['gone'])
    assert [(v.verdict, v.stalled) for v in report.verdicts if v.job_id == job.id] == [('recovered', 1)]
    job = Job.fetch(job.id, connection=new_client)
    assert (job.stalled, job.exempt_recoveries) == (1, 0)
    assert new_client.hget(job.key, 'stall_epochs') == old_run_id.encode()


def test_frozen_primary_promoted_then_thawed_no_counted_stall_no_failure(fleet, tmp_path: Path) -> None:
    f = fleet()
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('frz', connection=client)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'z', str(release), max_stalled=1)
    worker = f.worker('frz')
    f.cron('frz')
    wait_for(lambda: lease_on(client, job, old.run_id()), 30, what='job running')
    frozen_at = time.monotonic()
    _, new = f.topology.freeze_until_promoted()
    promoted = f.topology.promoted_at or time.monotonic()
    new_client, new_run_id = new.client(), new.run_id()
    wait_for(lambda: lease_on(new_client, job, new_run_id), 15, what='lease re-stamped on the new primary')
    reached = time.monotonic() - promoted
    f.topology.thaw(old)
    release.touch()
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 30, what='job finished')
    assert worker.proc.poll() is None
    job = Job.fetch(job.id, connection=new_client)
    assert executions(log, 'z') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert len(job.results()) == 1
    assert job.id not in FailedJobRegistry('frz', connection=new_client)
    assert not [v for v in f.verdicts if v[1] == job.id and v[2] in ('recovered', 'dead', 'exempt')]
    print(f'\n[{f.topology.kind}] frozen primary: promoted {promoted - frozen_at:.2f}s after the freeze; worker '
          f're-stamped its lease on the new primary {reached:.2f}s after the promotion')  # fmt: skip


@pytest.mark.parametrize('worker_class', ['rq_epoch.Worker', 'rq_epoch.SpawnWorker'])
def test_outcome_right_after_a_failover_is_recorded_on_the_new_primary(
    fleet, tmp_path: Path, worker_class: str
) -> None:
    """The work-horse asks the sentinels before it records the outcome, however recently it asked.

    With a 10 s heartbeat the worker asks the sentinels every 5 s; the job ends as soon as the
    promotion is seen, long before that: its outcome must still land on the new primary. A
    spawned work-horse (a process of its own, connected through the sentinels) too.
    """
    f = fleet()
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('out', connection=client)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'o', str(release))
    worker = f.worker(
        'out', env={'RQ_EPOCH_HEARTBEAT_INTERVAL': '10', 'RQ_EPOCH_RESTART_GRACE': '20'}, worker_class=worker_class
    )
    wait_for(lambda: lease_on(client, job, old.run_id()), 30, what='job running')
    wait_for(lambda: executions(log, 'o')[0] == 1, 30, what='job function running')
    _, new = f.topology.failover()
    release.touch()
    new_client = new.client()
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 15, what='outcome on the new primary')
    assert executions(log, 'o') == (1, 1)
    job = Job.fetch(job.id, connection=new_client)
    assert len(job.results()) == 1 and job.stalled == 0
    wait_for(lambda: new_client.zcard(keys.leases_key('out')) == 0, 10, what='the lease removed on the new primary')
    assert worker.proc.poll() is None


def test_stock_spawn_worker_fails_every_job_under_sentinel(fleet, tmp_path: Path) -> None:
    """For the record: RQ's SpawnWorker writes its connection's settings into the work-horse's
    source as text; a Sentinel pool does not survive that, so the work-horse dies at once and
    RQ fails the job. rq_epoch.SpawnWorker runs it (the test above)."""
    f = fleet()
    client = f.topology.current_primary().client()
    log = tmp_path / 'log'
    job = Queue('stock-spawn', connection=client).enqueue('tests.jobs.record', str(log), 's')
    worker = f.worker('stock-spawn', worker_class='rq.SpawnWorker')
    wait_for(lambda: client.hget(job.key, 'status') == b'failed', 60, what='the job failed')
    assert not log.exists()  # its function never ran
    result = Job.fetch(job.id, connection=client).latest_result()
    assert result is not None and 'Work-horse terminated unexpectedly' in (result.exc_string or '')
    assert worker.proc.poll() is None


def test_failover_under_min_replicas_to_write_worker_survives_outcome_once(fleet, tmp_path: Path) -> None:
    guard = {'min-replicas-to-write': '1', 'min-replicas-max-lag': '10'}
    f = fleet(replicas=2, primary_config=guard, replica_config=guard)
    old = f.topology.current_primary()
    client = old.client()
    queue = Queue('mr', connection=client)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'm', 6)
    worker = f.worker('mr')
    idle = f.worker('mr-idle')  # an idle worker blocked on the old primary
    f.cron('mr')
    wait_for(lambda: lease_on(client, job, old.run_id()), 30, what='job running')
    wait_for(lambda: 'ubscribing to channel' in idle.output(), 30, what='the idle worker up')
    _, new = f.topology.failover()

    def refuses_writes() -> bool:
        try:
            client.set('probe', 1)
        except redis.ResponseError as exc:
            return 'NOREPLICAS' in str(exc)
        return False

    wait_for(refuses_writes, 15, what='the old primary answering NOREPLICAS')  # once its replicas left
    promoted = f.topology.promoted_at or time.monotonic()
    new_client, new_run_id = new.client(), new.run_id()
    wait_for(lambda: lease_on(new_client, job, new_run_id), 15, what='lease re-stamped on the new primary')
    reached = time.monotonic() - promoted
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 30, what='job finished')
    later = Queue('mr-idle', connection=new_client).enqueue('tests.jobs.add', 2, 3)
    wait_for(lambda: later.get_status(refresh=True) == JobStatus.FINISHED, 20, what='idle worker serving again')
    assert worker.proc.poll() is None and idle.proc.poll() is None
    assert 'quitting' not in worker.output() and 'quitting' not in idle.output()
    job = Job.fetch(job.id, connection=new_client)
    assert executions(log, 'm') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert len(job.results()) == 1
    print(f'\n[{f.topology.kind}] min-replicas-to-write 1: worker re-stamped its lease on the new primary '
          f'{reached:.2f}s after the promotion')  # fmt: skip


def test_an_idle_fleet_on_several_queues_follows_a_failover(fleet, tmp_path: Path) -> None:
    """Idle workers on three queues (a watcher, the others waiting for its baton): after a
    failover every job enqueued on the new primary runs, and no worker quits."""
    f = fleet()
    queues = ('fo-a', 'fo-b', 'fo-c')
    set_id = keys.queue_set_id(keys.queue_key(name) for name in queues)
    old = f.topology.current_primary()
    client = old.client()
    workers = [f.worker(*queues, worker_class='tests.workers.EpochWorkerCountingWakes') for _ in range(3)]
    wait_for(lambda: client.scard(keys.workers_key()) == 3, 60, what='3 workers registered')
    wait_for(lambda: client.get(keys.watch_key(set_id)), 30, what='a watcher on the first primary')
    _, new = f.topology.failover()
    new_client = new.client()
    log = tmp_path / 'log'
    jobs = [Queue(name, connection=new_client).enqueue('tests.jobs.record', str(log), name) for name in queues * 2]
    for job in jobs:
        wait_for(lambda job=job: new_client.hget(job.key, 'status') == b'finished', 60, what='every job done')
    wait_for(lambda: new_client.get(keys.watch_key(set_id)), 30, what='a watcher on the new primary')
    assert all(worker.proc.poll() is None for worker in workers)
    assert sorted(log.read_text().split()[::2]) == sorted(queues * 2)
