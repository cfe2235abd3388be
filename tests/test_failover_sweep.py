"""The sweep under Sentinel: grace from the promotion, no verdict from a replica or a cut-off primary.

Real processes on loopback: a primary, a replica and three sentinels (``tests/sentinel.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Callback
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.leases import expire, start_job
from tests.sentinel import SentinelTopology, sentinel_available
from tests.test_cli import run

from .conftest import SERVER_KINDS

pytestmark = pytest.mark.sentinel


@pytest.fixture(params=SERVER_KINDS)
def topology(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SentinelTopology]:
    if not sentinel_available(request.param):
        if os.environ.get('CI'):
            pytest.fail(f'CI runs the failover tests: {request.param}-server cannot run as a sentinel here')
        pytest.skip(f'{request.param}-server cannot run as a sentinel here')
    topo = SentinelTopology(tmp_path / 'topology', request.param)
    topo.start()
    try:
        yield topo
    finally:
        topo.close()


def uptime(client: redis.Redis) -> int:
    return int(client.info('server')['uptime_in_seconds'])


def synced(primary: redis.Redis, replica: redis.Redis, key: str) -> bool:
    """Whether the replica has caught up with everything the primary wrote so far."""
    offset = int(primary.info('replication')['master_repl_offset'])
    caught_up = int(replica.info('replication')['slave_repl_offset']) >= offset
    return caught_up and primary.exists(key) == replica.exists(key)


def status(server: EmbeddedServer, *args: str) -> dict:
    """``rq-epoch status --json`` (by URL, or with the connection options given)."""
    result = run('status', *(args or ('-u', server.url)), '--grace', '3', '--json')
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_sweep_on_a_replica_judges_nothing(topology: SentinelTopology) -> None:
    primary, replica = topology.primary.client(), topology.replica.client()
    queue = Queue('rep', connection=primary)
    job, member = start_job(primary, queue, max_stalled=1)
    wait_for(lambda: synced(primary, replica, job.key), 10, what='the replica has the lease')
    report = Sweeper(replica, restart_grace=0).sweep(['rep'])
    assert report.primary is not None and report.primary.role == 'slave' and report.primary.state == 'replica'
    assert report.verdicts == [] and not report.judged
    # Nothing was judged: on the primary the lease is still there and the job still started.
    assert primary.zscore(keys.leases_key('rep'), member) is not None
    assert Job.fetch(job.id, connection=primary).get_status() == JobStatus.STARTED
    # The command line says so too, even when told to be quiet, and writes nothing there.
    result = run('sweep', '-u', topology.replica.url, '-q', 'rep', '--grace', '0', '--quiet')
    assert result.exit_code == 0 and result.stdout == ''
    assert 'nothing judged' in result.stderr and 'a replica' in result.stderr
    doc = status(topology.replica)
    assert (doc['server']['role'], doc['server']['state'], doc['restart_grace_left']) == ('slave', 'replica', None)
    on_primary = Sweeper(primary, restart_grace=0).sweep(['rep'])
    assert [(v.verdict, v.stalled) for v in on_primary.verdicts] == [('dead', 1)]


def test_the_restart_grace_counts_from_the_promotion_not_the_uptime(topology: SentinelTopology) -> None:
    old = topology.primary.client()
    queue = Queue('grace', connection=old)
    job, member = start_job(old, queue, expired=False)
    stamp = old.hget(job.key, 'lease_epoch')
    replica = topology.replica.client()
    wait_for(lambda: synced(old, replica, job.key), 10, what='the replica has the lease')
    wait_for(lambda: uptime(replica) >= 4, 10, what='the replica up for 4 s')
    asked_at = time.monotonic()  # before the promotion: the test sees it only when it polls
    _, promoted = topology.failover()
    new = promoted.client()
    assert uptime(new) >= 4  # process uptime alone would let a 3 s grace pass at once
    expire(new, 'grace', member)
    sweeper = Sweeper(new, restart_grace=3)
    first = sweeper.sweep(['grace'])
    assert [v.verdict for v in first.verdicts] == ['deferred']
    assert first.primary is not None and first.primary.is_primary and first.primary.age < 3
    settings = topology.settings_module(topology.base_dir / 'settings')
    doc = status(promoted, '-c', settings, '-P', str(topology.base_dir / 'settings'))  # through the sentinels
    assert doc['server']['run_id'] == new.info('server')['run_id']
    assert (doc['server']['role'], doc['server']['state']) == ('master', 'primary')
    assert doc['server']['uptime'] >= 4 and doc['server']['primary_for'] < 3
    assert 1 <= doc['restart_grace_left'] <= 3
    text = run('status', '-u', promoted.url, '--grace', '3').stdout
    assert 'primary for ' in text and 'restart grace: 3s' in text
    report = wait_for(lambda: (r := sweeper.sweep(['grace'])).total and r, 15, what='the grace to pass')
    waited = time.monotonic() - asked_at
    assert [(v.verdict, v.lease_epoch) for v in report.verdicts] == [('exempt', stamp.decode())]
    assert report.primary is not None and report.primary.age >= 3
    assert waited >= 3
    assert Job.fetch(job.id, connection=new).stalled == 0
    assert status(promoted)['restart_grace_left'] == 0
    # The epoch is recorded in the server, under the promoted process's run_id.
    run_id = new.info('server')['run_id']
    assert any(f.decode().startswith(run_id) for f in new.hkeys(keys.primaries_key()))


def test_a_demoted_primary_judges_nothing_before_the_sentinels_convert_it(topology: SentinelTopology) -> None:
    old_client = topology.primary.client()
    queue = Queue('split', connection=old_client)
    job, member = start_job(old_client, queue, expired=False, max_stalled=1)
    first = Sweeper(old_client, restart_grace=0).sweep(['split'])  # records: this primary has a replica
    assert first.primary is not None and first.primary.replicas_expected == 1
    old, _ = topology.failover()
    assert topology.role(old) == 'master'  # still a writable master until the sentinels look at it again
    expire(old_client, 'split', member)
    report = Sweeper(old_client, restart_grace=0).sweep(['split'])
    assert report.primary is not None and report.primary.state == 'isolated'
    assert report.verdicts == [] and not report.judged
    assert old_client.zscore(keys.leases_key('split'), member) is not None
    assert Job.fetch(job.id, connection=old_client).stalled == 0
    doc = status(old)
    assert (doc['server']['role'], doc['server']['state'], doc['server']['replicas_expected']) == (
        'master',
        'isolated',
        1,
    )
    assert 'ISOLATED' in run('status', '-u', old.url, '--grace', '0').stdout


def test_counted_verdicts_no_replica_acknowledges_run_no_side_effects(topology: SentinelTopology) -> None:
    primary = topology.primary.client()
    queue = Queue('ack', connection=primary)
    job, member = start_job(primary, queue, max_stalled=1, on_failure=Callback('tests.jobs.on_failure_record'))
    sweeper = Sweeper(primary, restart_grace=0)
    sweeper.sweep(['nothing'])  # this primary is seen with its replica
    topology.freeze(topology.replica)  # still listed online for a while, but acknowledges nothing
    try:
        report = sweeper.sweep(['ack'])
        assert [(v.verdict, v.stalled) for v in report.verdicts] == [('dead', 1)]
        assert report.unconfirmed == 1 and report.finished == []
        assert primary.llen(f'test:on_failure:{job.id}') == 0  # no callback
        assert Job.fetch(job.id, connection=primary).results() == []  # no failure result
    finally:
        topology.thaw(topology.replica)
    later = wait_for(lambda: (r := sweeper.sweep(['ack'])).finished and r, 15, what='a confirmed sweep')
    assert later.finished == [job.id] and later.unconfirmed == 0
    assert primary.llen(f'test:on_failure:{job.id}') == 1
    assert len(Job.fetch(job.id, connection=primary).results()) == 1


def test_a_primary_promoted_again_defers_its_own_earlier_stamps_during_the_grace(topology: SentinelTopology) -> None:
    """A, then B, then A again: a lease A stamped in its first term is not counted at once in its second."""
    first_term = topology.primary.client()
    queue = Queue('again', connection=first_term)
    job, member = start_job(first_term, queue, expired=False)
    stamp = first_term.hget(job.key, 'lease_epoch')
    Sweeper(first_term, restart_grace=3).sweep(['again'])  # records A's first term
    topology.failover()  # A -> B
    topology.wait_ready(30)  # A is B's replica, in sync
    _, back = topology.failover()  # B -> A
    assert back.port == topology.primary.port
    client = back.client()
    assert client.hget(job.key, 'lease_epoch') == stamp == client.info('server')['run_id'].encode()
    expire(client, 'again', member)
    sweeper = Sweeper(client, restart_grace=3)
    first = sweeper.sweep(['again'])
    assert [v.verdict for v in first.verdicts] == ['deferred']  # not counted: the stamp is from A's first term
    assert Job.fetch(job.id, connection=client).stalled == 0
    report = wait_for(lambda: (r := sweeper.sweep(['again'])).total and r, 15, what='the grace to pass')
    # After the grace a live worker would have stamped it again; this one's worker is gone.
    assert [v.verdict for v in report.verdicts] == ['recovered']
