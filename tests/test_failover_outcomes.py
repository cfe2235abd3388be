"""Finished stays finished across a failover: a job never ends with two outcomes.

A primary, a replica whose replication link goes through a loopback proxy
(``tests/proxy.py``), three sentinels (``tests/sentinel.py``) and a real ``rq worker``. The
test holds the replication stream, so that the worker's take and grant (and what follows)
are acknowledged by the primary and never reach the replica; then the replica is promoted
without them, and the old primary is demoted (it resyncs from the new one and loses them).
The execution that ran on the old primary sends its outcome to the new one, where the job
waits in its queue as if it had never been taken.

The sentinels' failover timeout is long here: a sentinel re-points a replica that replicates
from another address than the primary's (the proxy's) once that timeout has passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Retry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.proxy import HoldingProxy
from tests.sentinel import SentinelTopology
from tests.test_failover_workers import Fleet, _topology, executions, moved_lines

pytestmark = pytest.mark.sentinel

#: The replica drops a link that sends nothing for ``repl-timeout``: longer than any hold here.
_LONG_LINK = {'repl-timeout': '120'}


class HeldLink:
    """A topology whose replica replicates through a :class:`HoldingProxy`, and a worker fleet on it."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.proxies: list[HoldingProxy] = []

        def link(primary_port: int) -> int:
            proxy = HoldingProxy(primary_port, hold_limit=600)
            self.proxies.append(proxy)
            return proxy.port

        self.topology: SentinelTopology = _topology(
            kind,
            tmp_path / 'topology',
            failover_timeout_ms=180_000,
            replication_link=link,
            primary_config=_LONG_LINK,
            replica_config=_LONG_LINK,
        )
        self.topology.start()
        self.fleet = Fleet(self.topology, tmp_path)

    @property
    def proxy(self) -> HoldingProxy:
        return self.proxies[0]

    def hold_after_grant(self, job: Job, client: redis.Redis, replica: redis.Redis) -> bytes:
        """Once the replica has the grant of ``job``'s running execution, hold everything the
        primary sends it from then on; returns the execution's id."""
        execution = client.hget(job.key, 'lease_execution')
        wait_for(lambda: replica.hget(job.key, 'lease_execution') == execution, 15, what='the grant on the replica')
        self.proxy.hold_downstream()
        return execution

    def close(self) -> None:
        self.fleet.close()
        for proxy in self.proxies:
            proxy.close()
        self.topology.close()


@pytest.fixture
def held_link(kind: str, tmp_path: Path) -> Iterator[HeldLink]:
    made = HeldLink(kind, tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=['valkey', 'redis'])
def kind(request: pytest.FixtureRequest) -> str:
    from tests.conftest import SERVER_KINDS

    if request.param not in SERVER_KINDS:
        pytest.skip(f'{request.param}-server is not installed')
    return str(request.param)


def test_an_outcome_whose_take_and_grant_a_failover_lost_is_refused_and_the_job_ends_once(
    held_link: HeldLink, tmp_path: Path
) -> None:
    """Without durability: the job runs again, uncounted, and ends with one outcome."""
    topology, f = held_link.topology, held_link.fleet
    old = topology.current_primary()
    client, replica = old.client(), topology.replica.client()
    queue = Queue('lost', connection=client)
    log, release = tmp_path / 'log', tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'x', str(release))
    wait_for(lambda: replica.lrange(queue.key, 0, -1) == [job.id.encode()], 15, what='the enqueue on the replica')
    held_link.proxy.hold_downstream()  # from now on the primary acknowledges what the replica never gets
    worker = f.worker('lost')
    wait_for(lambda: executions(log, 'x')[0] == 1, 30, what='the job running on the old primary')
    first = client.hget(job.key, 'lease_execution')
    assert first and client.zscore(keys.leases_key('lost'), job.id) is not None  # granted there
    assert replica.lrange(queue.key, 0, -1) == [job.id.encode()]  # ... and not on the replica
    assert replica.zcard(keys.leases_key('lost')) == 0

    _, new = topology.failover()
    assert new.port == topology.replica.port
    new_client = new.client()
    # The promoted replica never saw the take or the grant: the job waits in its queue.
    assert new_client.lrange(queue.key, 0, -1) == [job.id.encode()]
    assert new_client.hget(job.key, 'lease_execution') is None
    wait_for(lambda: moved_lines(worker), 30, what='the worker to follow the new primary')
    release.touch()  # the first execution ends: its outcome goes to the new primary

    wait_for(lambda: executions(log, 'x') == (2, 2), 30, what='the job run again on the new primary')
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 30, what='the job finished')
    done = Job.fetch(job.id, connection=new_client)
    assert len(done.results()) == 1  # one outcome, never two
    assert done.lease_execution and done.lease_execution != first.decode()  # the second execution's
    assert done.stale_outcomes == 1 and (done.stalled, done.exempt_recoveries) == (0, 0)
    assert new_client.hget(keys.stats_key('lost'), 'refused') == b'1'
    out = worker.output()
    assert f'refused the success of job {job.id} from execution {first.decode()}' in out, out
    assert 'waits in' in out
    # Not runnable after its outcome landed: in no list it can be taken from, no lease left.
    assert new_client.lpos(queue.key, job.id) is None
    assert new_client.lpos(keys.intermediate_key('lost'), job.id) is None
    assert new_client.zcard(keys.leases_key('lost')) == 0
    assert not Sweeper(new_client, restart_grace=0).sweep(['lost']).verdicts

    # The old primary is demoted and resyncs from the new one: the same single outcome there.
    topology.wait_demoted(old, 60)
    wait_for(lambda: client.hget(job.key, 'status') == b'finished', 15, what='the outcome on the demoted primary')
    assert len(Job.fetch(job.id, connection=client).results()) == 1
    assert executions(log, 'x') == (2, 2)
    assert worker.proc.poll() is None


DURABLE = {'RQ_EPOCH_DURABLE_REPLICAS': '1', 'RQ_EPOCH_DURABLE_TIMEOUT': '300'}


def test_with_durability_a_grant_the_failover_lost_is_not_worked_on_and_the_job_runs_once(
    held_link: HeldLink, tmp_path: Path
) -> None:
    """The grant is acknowledged by the primary only: the worker waits for a replica before it
    runs the job, finds after the failover that the new primary never got the grant, and
    leaves the job where it waits; it runs once, from the new primary's queue."""
    topology, f = held_link.topology, held_link.fleet
    old = topology.current_primary()
    client, replica = old.client(), topology.replica.client()
    queue = Queue('grant', connection=client)
    log, release = tmp_path / 'log', tmp_path / 'release'
    release.touch()  # the job ends as soon as it runs
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'g', str(release))
    wait_for(lambda: replica.lrange(queue.key, 0, -1) == [job.id.encode()], 15, what='the enqueue on the replica')
    held_link.proxy.hold_downstream()
    worker = f.worker('grant', env=DURABLE)
    wait_for(lambda: 'no replica confirmed the grant of job' in worker.output(), 30, what='the grant unconfirmed')
    first = client.hget(job.key, 'lease_execution')
    assert first and executions(log, 'g') == (0, 0)  # granted on the old primary, not run
    assert replica.lrange(queue.key, 0, -1) == [job.id.encode()]  # the replica never got the take
    assert replica.hget(job.key, 'lease_execution') is None
    _, new = topology.failover()
    new_client = new.client()
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 60, what='the job finished on the new primary')
    out = worker.output()
    assert f'the grant of job {job.id} to execution {first.decode()} was lost' in out, out
    done = Job.fetch(job.id, connection=new_client)
    assert executions(log, 'g') == (1, 1)  # once, and only from the new primary
    assert len(done.results()) == 1
    assert done.lease_execution != first.decode()
    assert (done.stale_outcomes, done.stalled, done.exempt_recoveries) == (0, 0, 0)
    assert new_client.lpos(queue.key, job.id) is None and new_client.zcard(keys.leases_key('grant')) == 0
    topology.wait_demoted(old, 60)
    wait_for(lambda: client.hget(job.key, 'status') == b'finished', 15, what='the outcome on the demoted primary')
    assert executions(log, 'g') == (1, 1) and worker.proc.poll() is None


def test_with_durability_an_outcome_the_failover_lost_is_written_again_on_the_new_primary_once(
    held_link: HeldLink, tmp_path: Path
) -> None:
    """The grant reached the replica; the outcome is acknowledged by the primary only. The
    work-horse keeps it, follows the failover and writes it again there through the fence:
    the job is finished once and never runs again."""
    topology, f = held_link.topology, held_link.fleet
    old = topology.current_primary()
    client, replica = old.client(), topology.replica.client()
    queue = Queue('outcome', connection=client)
    log, release = tmp_path / 'log', tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'o', str(release))
    worker = f.worker('outcome', env=DURABLE)
    wait_for(lambda: executions(log, 'o')[0] == 1, 30, what='the job running')
    execution = held_link.hold_after_grant(job, client, replica)
    release.touch()
    wait_for(lambda: client.hget(job.key, 'status') == b'finished', 30, what='the outcome on the old primary')
    wait_for(lambda: 'no replica confirmed the success of job' in worker.output(), 30, what='the outcome unconfirmed')
    assert replica.hget(job.key, 'status') == b'started'  # the replica never got it
    _, new = topology.failover()
    new_client = new.client()
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 60, what='the outcome written again')
    out = worker.output()
    assert 'writing it again there' in out, out
    done = Job.fetch(job.id, connection=new_client)
    assert len(done.results()) == 1 and done.lease_execution == execution.decode()
    assert (done.stale_outcomes, done.stalled, done.exempt_recoveries) == (0, 0, 0)
    assert new_client.zcard(keys.leases_key('outcome')) == 0
    assert new_client.lpos(queue.key, job.id) is None
    assert not [v for v in Sweeper(new_client, restart_grace=0).sweep(['outcome']).verdicts if v.job_id == job.id]
    topology.wait_demoted(old, 60)
    wait_for(lambda: client.hget(job.key, 'status') == b'finished', 15, what='the outcome on the demoted primary')
    assert len(Job.fetch(job.id, connection=client).results()) == 1
    assert executions(log, 'o') == (1, 1) and worker.proc.poll() is None


def test_with_durability_a_failure_written_again_on_the_new_primary_spends_one_retry(
    held_link: HeldLink, tmp_path: Path
) -> None:
    """A job enqueued with ``Retry(max=3)`` fails; its failure (one retry spent, the job requeued)
    is acknowledged by the old primary only. The work-horse writes it again on the new primary,
    from the job as it was before the first write: one retry spent in all, not one per write."""
    topology, f = held_link.topology, held_link.fleet
    old = topology.current_primary()
    client, replica = old.client(), topology.replica.client()
    queue = Queue('retry', connection=client)
    log, release = tmp_path / 'log', tmp_path / 'release'
    # The first run fails once released; the next one (release there) returns at once.
    job = queue.enqueue('tests.jobs.gated', str(log), 'f', str(release), 'raise', retry=Retry(max=3))
    worker = f.worker('retry', env=DURABLE)
    wait_for(lambda: log.exists(), 30, what='the first run under way')
    held_link.hold_after_grant(job, client, replica)
    release.touch()
    wait_for(lambda: client.hget(job.key, 'retries_left') == b'2', 30, what='the failure on the old primary')
    wait_for(lambda: 'no replica confirmed the failure of job' in worker.output(), 30, what='the failure unconfirmed')
    assert replica.hget(job.key, 'status') == b'started' and replica.hget(job.key, 'retries_left') == b'3'
    _, new = topology.failover()
    new_client = new.client()
    wait_for(lambda: new_client.hget(job.key, 'status') == b'finished', 90, what='the job finished on its retry')
    out = worker.output()
    assert 'writing it again there' in out, out
    done = Job.fetch(job.id, connection=new_client)
    assert done.retries_left == 2, out  # one retry spent, though the failure was written twice
    assert log.read_text().count('start f') == 2  # the failed run and its one retry
    assert len(done.results()) == 1 and done.latest_result().type.name == 'SUCCESSFUL'
    assert (done.stale_outcomes, done.stalled, done.exempt_recoveries) == (0, 0, 0)
    topology.wait_demoted(old, 60)
    wait_for(lambda: client.hget(job.key, 'status') == b'finished', 15, what='the outcome on the demoted primary')
    assert Job.fetch(job.id, connection=client).retries_left == 2
    assert worker.proc.poll() is None
