"""The extend script that every heartbeat runs: what it writes, what it leaves alone, how it reads the run_id."""

from __future__ import annotations

import math

import pytest
import redis

from rq_epoch import Queue, StartedJobRegistry
from rq_epoch.protocol import keys, scripts, verbs
from tests.leases import current_run_id, start_job
from tests.test_epoch_rule import INVALID, NOW


def extend(conn: redis.Redis, queue: Queue, job_id: str, ttl: int = 30) -> verbs.ExtendReply:
    """Run the extend script as a heartbeat of the execution that holds the lease does, with
    the keys the worker's registry gives it."""
    registry = StartedJobRegistry(queue.name, connection=conn)
    return verbs.extend(conn, registry.extend_keys(job_id), [job_id, ttl, holder(conn, job_id)])


def holder(conn: redis.Redis, job_id: str) -> str:
    """The execution that holds the job's lease (its ``lease_execution``)."""
    return conn.hget(keys.job_key(job_id), 'lease_execution').decode()


def test_extend_stamps_a_lease_that_has_no_stamp(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, epoch=None, expired=False)
    assert conn.hget(job.key, 'lease_epoch') is None
    reply = extend(conn, queue, job.id)
    assert (reply.extended, reply.taken) == (True, '')
    assert conn.hget(job.key, 'lease_epoch') == reply.run_id.encode() == current_run_id(conn).encode()


def test_extend_of_a_stamp_of_this_process_does_not_write_it_again(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    before = conn.zscore(StartedJobRegistry(queue.name, connection=conn).leases_key, member)
    conn.config_resetstat()
    reply = extend(conn, queue, job.id, ttl=120)
    stats = conn.info('commandstats')
    assert reply.extended and reply.deadline > before
    assert conn.hget(job.key, 'lease_epoch') == reply.run_id.encode()
    assert 'cmdstat_hset' not in stats  # the stamp was read, not written
    assert stats['cmdstat_hmget']['calls'] == 1


def test_extend_does_not_bring_back_a_job_hash_that_is_gone(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    execution = holder(conn, job.id)
    conn.delete(job.key)
    registry = StartedJobRegistry(queue.name, connection=conn)
    reply = verbs.extend(conn, registry.extend_keys(job.id), [job.id, 30, execution])
    assert (reply.extended, reply.taken) == (False, '')  # no holder: the lease is left for the sweep, a ghost
    assert conn.exists(job.key) == 0


def test_extend_gives_rqs_entry_its_no_expiry_score_again_but_never_adds_it(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    registry = StartedJobRegistry(queue.name, connection=conn)
    entry = f'{job.id}:{holder(conn, job.id)}'  # RQ's member: the execution's composite key
    conn.zadd(registry.key, {entry: 1}, xx=True)  # a finite score, as stock cleanup would act on
    extend(conn, queue, job.id)
    assert conn.zscore(registry.key, entry) == math.inf
    conn.zrem(registry.key, entry)
    extend(conn, queue, job.id)
    assert conn.zscore(registry.key, entry) is None


def test_extend_twice_in_one_transaction_keeps_the_lease(conn) -> None:
    """The second extend may find the deadline unchanged (a server whose clock is frozen for the
    transaction): a lease whose score did not change still exists."""
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    registry = StartedJobRegistry(queue.name, connection=conn)
    scripts.extend().load(conn)
    with conn.pipeline() as pipe:
        for _ in range(2):
            scripts.extend().queue(pipe, registry.extend_keys(job.id), [job.id, 30, holder(conn, job.id)])
        first, second = (verbs.ExtendReply.read(reply) for reply in pipe.execute())
    assert first.extended and second.extended
    assert second.taken == ''
    assert conn.zscore(registry.leases_key, member) is not None


def _run_id_of(conn: redis.Redis, info: str) -> bytes | None:
    source = scripts._expand('-- @include _epoch.lua\n') + 'return run_id_of(ARGV[1]) or false\n'
    return conn.eval(source, 0, info)


def _info(run_id_line: str) -> str:
    lines = ['# Server', 'redis_version:7.2.4', 'process_id:1', run_id_line, 'tcp_port:6379', 'uptime_in_seconds:5']
    return '\r\n'.join(lines) + '\r\n'


def test_scripts_read_a_valid_run_id_from_info_text(conn) -> None:
    assert _run_id_of(conn, _info(f'run_id:{NOW}')) == NOW.encode()
    assert _run_id_of(conn, _info(f'run_id:{NOW}').replace('\r\n', '\n')) == NOW.encode()


@pytest.mark.parametrize('value', INVALID, ids=['empty', 'short', 'upper', 'g', 'long'])
def test_scripts_refuse_a_run_id_of_the_wrong_shape(conn, value: str) -> None:
    assert _run_id_of(conn, _info(f'run_id:{value}')) is None


def test_scripts_refuse_info_text_without_a_run_id_line(conn) -> None:
    assert _run_id_of(conn, _info('tcp_port:6380')) is None
    assert _run_id_of(conn, _info(f'master_run_id:{NOW}')) is None
