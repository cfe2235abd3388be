"""The record of life (``note_alive`` in ``lua/_epoch.lua``): written by the scripts that run
often, at most once a second per server, one term per replication id, at most 8 processes."""

from __future__ import annotations

import pytest
import redis
from rq.exceptions import DequeueTimeout

from rq_epoch import Job, Queue
from rq_epoch.jobs.job import StartedJobRegistry
from rq_epoch.protocol import epoch, keys, scripts, verbs
from rq_epoch.worker.take import Taker
from rq_epoch.worker.tickets import take_tickets
from tests.conftest import wait_for
from tests.leases import current_run_id, start_job


def server_time(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def extend(conn: redis.Redis, job_id: str, execution: str) -> None:
    registry = StartedJobRegistry('life', connection=conn)
    assert verbs.extend(conn, registry.extend_keys(job_id), [job_id, 30, execution, keys.PREFIX]).extended


def record(conn: redis.Redis, run_id: str) -> epoch.SeenAlive | None:
    return epoch.parse_seen_alive(conn.hget(keys.alive_key(), run_id))


def test_heartbeats_note_the_server_alive_at_most_once_a_second(conn: redis.Redis) -> None:
    job, _ = start_job(conn, Queue('life', connection=conn), expired=False)
    run_id = current_run_id(conn)
    replid = str(conn.info('replication')['master_replid'])
    conn.config_set('notify-keyspace-events', 'Kh')
    pubsub = conn.pubsub()
    pubsub.subscribe(f'__keyspace@0__:{keys.alive_key()}')
    wait_for(lambda: pubsub.get_message(timeout=0.1), 5, what='the subscription')
    try:
        started = server_time(conn)
        for _ in range(400):
            extend(conn, job.id, job.lease_execution)
        ended = server_time(conn)
        writes = 0
        for _ in range(1000):
            message = pubsub.get_message(timeout=0.2)
            if message is None:
                break
            writes += message['data'] == b'hset'
    finally:
        pubsub.close()
        conn.config_set('notify-keyspace-events', '')
    assert 1 <= writes <= int(ended - started) + 2
    seen = record(conn, run_id)
    assert seen is not None and seen.replid == replid
    assert started <= seen.last <= ended and seen.first <= seen.last


def test_a_new_replication_id_starts_a_new_term_and_the_same_one_keeps_it(conn: redis.Redis) -> None:
    job, _ = start_job(conn, Queue('life', connection=conn), expired=False)
    run_id = current_run_id(conn)
    replid = str(conn.info('replication')['master_replid'])
    now = server_time(conn)
    conn.hset(keys.alive_key(), run_id, f'{now - 5:.6f} {replid} {now - 100:.6f}')
    extend(conn, job.id, job.lease_execution)
    kept = record(conn, run_id)
    assert kept is not None and kept.first == round(now - 100, 6) and kept.last >= now
    conn.hset(keys.alive_key(), run_id, f'{now - 5:.6f} {"c" * 40} {now - 100:.6f}')  # an earlier term
    extend(conn, job.id, job.lease_execution)
    fresh = record(conn, run_id)
    assert fresh is not None and fresh.replid == replid and fresh.first == fresh.last >= now
    # A deadline that fell in the earlier term is not taken for one of the new term.
    assert not epoch.died_under(now - 50, fresh)


def test_a_new_process_forgets_the_one_seen_least_recently(conn: redis.Redis) -> None:
    job, _ = start_job(conn, Queue('life', connection=conn), expired=False)
    run_id = current_run_id(conn)
    others = {f'{i:040x}': f'{1000 + i}.000000 {"d" * 40} 900.000000' for i in range(8)}
    conn.hset(keys.alive_key(), mapping=others)
    extend(conn, job.id, job.lease_execution)
    kept = {k.decode() for k in conn.hkeys(keys.alive_key())}
    assert len(kept) == 8
    assert run_id in kept and f'{0:040x}' not in kept  # the oldest "last seen" went


def test_a_dry_run_sweep_writes_no_record(conn: redis.Redis) -> None:
    from rq_epoch import Sweeper

    start_job(conn, Queue('life', connection=conn))
    Sweeper(conn, restart_grace=0).sweep(['life'], dry_run=True)
    assert not conn.exists(keys.alive_key())
    Sweeper(conn, restart_grace=0).sweep(['life'])
    assert record(conn, current_run_id(conn)) is not None


def test_an_idle_workers_sweep_ticket_notes_the_server_alive(conn: redis.Redis) -> None:
    """Idle workers run no heartbeat: their ticket call every sweep interval keeps the record fresh."""
    run_id = current_run_id(conn)
    conn.hdel(keys.alive_key(), run_id)
    before = server_time(conn)
    take_tickets(conn, ['life-a', 'life-b'], 5)
    seen = record(conn, run_id)
    assert seen is not None
    assert before - 0.002 <= seen.last <= server_time(conn)


def test_the_idle_watchers_refresh_notes_the_server_alive(conn: redis.Redis) -> None:
    """An idle fleet's waiters sleep and its watcher sweeps once per interval: the watcher's
    refresh of the watch, a few times per TTL, keeps the record as fresh as a busy fleet's."""
    run_id = current_run_id(conn)
    queues = [Queue(name, connection=conn) for name in ('life-a', 'life-b')]
    taker = Taker(conn, watch_ttl=0.6)  # refreshed every 0.2 s
    scripts.load_all(conn)
    try:
        with pytest.raises(DequeueTimeout):
            taker.dequeue_any(queues, 0.5, job_class=Job)  # claims the watch (a plain SET NX)
        conn.hdel(keys.alive_key(), run_id)
        before = server_time(conn)
        with pytest.raises(DequeueTimeout):
            taker.dequeue_any(queues, 0.5, job_class=Job)  # refreshes it, with the script
        assert taker.counters.watch_terms == 1
        seen = record(conn, run_id)
        assert seen is not None
        assert before - 0.002 <= seen.last <= server_time(conn)
    finally:
        taker.close()
