"""Each verdict of the sweep does exactly what the verdict table of docs/design.md says, and nothing else."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import redis
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Job, Queue, StartedJobRegistry, Sweeper
from rq_epoch.protocol import keys, scripts, verbs
from tests.leases import OTHER_EPOCH, current_run_id, execution_of, expire, legacy_start_job, start_job


def snapshot(conn: redis.Redis, exclude: tuple[str, ...] = ()) -> dict[bytes, object]:
    """Every key with its type and value, to prove that nothing else changed.

    The records of primary epochs (written by the first sweep of an epoch) and of the
    server's last sign of life (written by a sweep at most once a second) are left out.
    """
    state: dict[bytes, object] = {}
    for key in conn.scan_iter(count=1000):
        if key in (b'rq:epoch:primaries', b'rq:epoch:alive') or any(key.decode().startswith(p) for p in exclude):
            continue
        kind = conn.type(key).decode()
        if kind == 'string':
            state[key] = conn.get(key)
        elif kind == 'hash':
            state[key] = conn.hgetall(key)
        elif kind == 'list':
            state[key] = conn.lrange(key, 0, -1)
        elif kind == 'set':
            state[key] = conn.smembers(key)
        elif kind == 'zset':
            state[key] = conn.zrange(key, 0, -1, withscores=True)
    return state


def sweep(conn: redis.Redis, queue: str = 'default', **kwargs: object):
    kwargs.setdefault('restart_grace', 0)
    return Sweeper(conn, **kwargs).sweep([queue])  # type: ignore[arg-type]


def lease_entries(conn: redis.Redis, queue: str = 'default') -> tuple[int, int]:
    return conn.zcard(keys.leases_key(queue)), conn.zcard(keys.wip_key(queue))


def test_ghost_removes_the_entry_and_rq_records_of_the_execution_and_nothing_else(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    execution = execution_of(job)
    conn.delete(job.key)
    excluded = ('rq:epoch:lease', 'rq:wip:', 'rq:execution', 'rq:worker:', 'rq:epoch:stats')
    before = snapshot(conn, exclude=excluded)
    report = sweep(conn)
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'ghost')]
    assert lease_entries(conn) == (0, 0)
    assert conn.exists(keys.execution_key(execution), keys.job_executions_key(job.id)) == 0
    assert not conn.sismember(keys.worker_executions_key('test-worker'), execution)
    assert snapshot(conn, exclude=excluded) == before
    assert not conn.exists(job.key)


def test_job_key_of_another_type_is_corrupt_and_left_untouched(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    conn.delete(job.key)
    conn.set(job.key, 'not a hash')
    report = sweep(conn)
    assert [v.verdict for v in report.verdicts] == ['corrupt']
    assert conn.get(job.key) == b'not a hash'
    assert lease_entries(conn) == (0, 0)


def test_malformed_member_is_corrupt(conn) -> None:
    """A lease's member is a job id (no colon); a 0.2.0 lease's is <job_id>:<execution_id>."""
    seconds, _ = conn.time()
    conn.zadd(keys.leases_key('default'), {'': seconds - 5, 'a:b': seconds - 5})
    conn.zadd(keys.legacy_leases_key('default'), {'no-execution-id': seconds - 5, 'a:b:c': seconds - 5})
    before = snapshot(conn, exclude=('rq:epoch:lease', 'rq:epoch:stats'))
    report = sweep(conn)
    assert sorted((v.member, v.verdict) for v in report.verdicts) == [
        ('', 'corrupt'),
        ('a:b', 'corrupt'),
        ('a:b:c', 'corrupt'),
        ('no-execution-id', 'corrupt'),
    ]
    assert conn.exists(keys.leases_key('default'), keys.legacy_leases_key('default')) == 0
    assert snapshot(conn, exclude=('rq:epoch:lease', 'rq:epoch:stats')) == before


def test_members_and_stamps_with_spaces_newlines_or_percent_signs_reach_the_report_unchanged(conn) -> None:
    """The script writes its records as lines of space-separated fields; a foreign entry's
    member, or a stamp, holding whitespace or '%' must come back as it was written."""
    seconds, _ = conn.time()
    odd = ['a b', 'line\nbreak:x', '100%', 'tab\there\r', ' ']
    conn.zadd(keys.leases_key('default'), {member: seconds - 5 for member in odd})
    queue = Queue('default', connection=conn)
    job, _ = start_job(conn, queue)
    conn.hset(job.key, 'lease_epoch', 'run id with %20 and\nnewline')
    conn.hset(job.key, 'status', 'finished')
    report = sweep(conn)
    # With a colon the member is malformed; without, it names a job that does not exist.
    expected = [(member, 'corrupt' if ':' in member else 'ghost') for member in odd]
    assert sorted((v.member, v.verdict) for v in report.verdicts) == sorted([*expected, (job.id, 'settled')])
    settled = [v for v in report.verdicts if v.verdict == 'settled']
    assert settled[0].lease_epoch == 'run id with %20 and\nnewline'


def test_finished_job_is_settled_and_keeps_its_result(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    conn.hset(job.key, 'status', 'finished')
    report = sweep(conn)
    assert [v.verdict for v in report.verdicts] == ['settled']
    job.refresh()
    assert job.get_status() == JobStatus.FINISHED
    assert job.stalled == 0
    assert lease_entries(conn) == (0, 0)
    assert conn.llen(queue.key) == 0
    assert job.id not in FailedJobRegistry('default', connection=conn)


def test_job_started_again_elsewhere_is_settled(conn) -> None:
    """A 0.2.0 lease of a job that a newer execution was granted since: settled, and the newer lease stays."""
    queue = Queue('default', connection=conn)
    job, member = legacy_start_job(conn, queue)
    old_execution = member.split(':')[1]
    scripts.grant()(conn, [keys.leases_key('default'), job.key], [job.id, 60, 'a-newer-execution'])
    expire(conn, 'default', member, key=keys.legacy_leases_key)
    report = sweep(conn)
    assert [(v.member, v.verdict) for v in report.verdicts] == [(member, 'settled')]
    assert conn.hget(job.key, 'status') == b'started'
    assert conn.hget(job.key, f'taken:{old_execution}') == b'settled'
    assert conn.zscore(keys.leases_key('default'), job.id) is not None
    assert conn.llen(queue.key) == 0


def test_exempt_requeues_at_the_front_without_counting(conn) -> None:
    queue = Queue('default', connection=conn)
    waiting = queue.enqueue('tests.jobs.add', 1, 1)
    job, member = start_job(conn, queue, epoch=OTHER_EPOCH)
    report = sweep(conn)
    assert [v.verdict for v in report.verdicts] == ['exempt']
    assert queue.get_job_ids() == [job.id, waiting.id]
    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.QUEUED
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    assert lease_entries(conn) == (0, 0)
    assert conn.hget(keys.stats_key('default'), 'exempt') == b'1'


def test_one_call_of_more_than_a_thousand_leases_requeues_each_as_one_push_per_lease_would(conn) -> None:
    """The sweep gathers its removals and pushes and sends them per call, 1,000 members per
    command: the queue, RQ's records and the report come out as with one command per lease."""
    queue = Queue('default', connection=conn)
    waiting = queue.enqueue('tests.jobs.add', 1, 1)
    jobs = [start_job(conn, queue, epoch=OTHER_EPOCH)[0] for _ in range(1_050)]
    judged = [m.decode() for m in conn.zrange(keys.leases_key('default'), 0, -1)]  # deadline order
    assert sorted(judged) == sorted(job.id for job in jobs)
    report = sweep(conn, batch_size=1_050)
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job_id, 'exempt') for job_id in judged]
    assert queue.get_job_ids() == [*reversed(judged), waiting.id]
    assert lease_entries(conn) == (0, 0)
    assert conn.scard(keys.worker_executions_key('test-worker')) == 0
    assert not list(conn.scan_iter(match='rq:execution:*', count=1000))
    assert conn.hget(keys.stats_key('default'), 'exempt') == b'1050'


def test_recovered_counts_and_requeues(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    report = sweep(conn, max_stalled=2)
    assert [(v.verdict, v.stalled, v.max_stalled) for v in report.verdicts] == [('recovered', 1, 2)]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (JobStatus.QUEUED, 1)
    assert queue.get_job_ids() == [job.id]


@pytest.mark.parametrize('reached', ['built directly', "through the job, by RQ's get_job_ids"])
def test_the_started_registrys_cleanup_is_the_epoch_aware_sweep(conn, reached: str) -> None:
    """rq-epoch's StartedJobRegistry answers RQ's cleanup() with the sweep (RQ's own cleanup finds
    nothing expired: RQ's entry of a managed job never expires)."""
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    if reached == 'built directly':
        StartedJobRegistry('default', connection=conn).cleanup()
    else:
        assert job.started_job_registry.get_job_ids() == []  # RQ runs cleanup() first
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (JobStatus.QUEUED, 1)
    assert queue.get_job_ids() == [job.id]
    assert lease_entries(conn) == (0, 0)


def test_stall_counts_written_by_hand_that_are_not_whole_numbers_count_as_unset(conn) -> None:
    queue = Queue('default', connection=conn)
    written = ['nan', '2.5', '1e300', '-1', 'many', 'inf']
    jobs = []
    for text in written:
        job, _ = start_job(conn, queue)
        conn.hset(keys.job_key(job.id), mapping={'stalled': text, 'max_stalled': text})
        jobs.append(job)
    report = sweep(conn, max_stalled=3)
    by_job = {v.job_id: (v.verdict, v.stalled, v.max_stalled) for v in report.verdicts}
    assert by_job == {job.id: ('recovered', 1, 3) for job in jobs}
    assert [conn.hget(keys.job_key(job.id), 'stalled') for job in jobs] == [b'1'] * len(jobs)
    assert queue.count == len(jobs)


def test_dead_moves_to_failed_registry(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, max_stalled=1)
    report = sweep(conn, max_stalled=5)
    assert [(v.verdict, v.stalled, v.max_stalled) for v in report.verdicts] == [('dead', 1, 1)]
    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.FAILED
    assert job.id in FailedJobRegistry('default', connection=conn)
    result = job.latest_result()
    assert result is not None and 'stalled 1 time(s) (max_stalled 1)' in (result.exc_string or '')
    assert report.finished == [job.id]
    assert queue.count == 0


def test_unexpired_leases_are_left_alone(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    report = sweep(conn)
    assert report.verdicts == []
    assert lease_entries(conn) == (1, 1)


def test_concurrent_sweepers_handle_each_lease_exactly_once(conn) -> None:
    queue = Queue('default', connection=conn)
    run_id = current_run_id(conn)
    jobs = []
    with conn.pipeline() as pipe:
        for i in range(2000):
            job = queue.create_job('tests.jobs.add', args=(i, i))
            job.origin = 'default'
            job.save(pipeline=pipe)
            epoch = run_id if i % 2 else OTHER_EPOCH  # half counted (recovered), half exempt
            pipe.hset(job.key, mapping={'status': 'started', 'lease_epoch': epoch, 'lease_execution': f'exec{i}'})
            pipe.zadd(keys.wip_key('default'), {f'{job.id}:exec{i}': '+inf'})
            pipe.zadd(keys.leases_key('default'), {job.id: 1})
            jobs.append(job.id)
        pipe.execute()

    reports = []
    errors = []

    def run() -> None:
        client = redis.Redis(connection_pool=conn.connection_pool)
        try:
            reports.append(Sweeper(client, max_stalled=3, restart_grace=0, batch_size=50).sweep(['default']))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    verdicts = [v for r in reports for v in r.verdicts]
    assert len(verdicts) == 2000
    assert Counter(v.job_id for v in verdicts).most_common(1)[0][1] == 1
    assert Counter(v.verdict for v in verdicts) == {'recovered': 1000, 'exempt': 1000}
    queued = queue.get_job_ids()
    assert len(queued) == 2000 and len(set(queued)) == 2000
    assert lease_entries(conn) == (0, 0)


def test_extend_after_the_sweep_does_not_bring_the_lease_back(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue)
    sweep(conn)
    leases_key = keys.leases_key('default')
    reply = verbs.extend(conn, [leases_key, job.key], [job.id, 30, job.lease_execution])
    assert not reply.extended
    assert reply.run_id == current_run_id(conn)
    assert reply.taken == 'recovered'  # the heartbeat learns which verdict took its lease
    assert conn.zscore(leases_key, member) is None


def test_extend_of_a_live_lease_pushes_the_deadline_and_restamps(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, epoch=OTHER_EPOCH, expired=False)
    leases_key = keys.leases_key('default')
    before = conn.zscore(leases_key, member)
    reply = verbs.extend(conn, [leases_key, job.key], [job.id, 120, job.lease_execution])
    assert reply.extended
    assert reply.taken == ''
    assert reply.deadline > before
    assert conn.hget(job.key, 'lease_epoch') == reply.run_id.encode()


def test_dry_run_writes_nothing(conn) -> None:
    queue = Queue('default', connection=conn)
    start_job(conn, queue)
    start_job(conn, queue, epoch=None)
    before = snapshot(conn)
    report = Sweeper(conn, restart_grace=0).sweep(['default'], dry_run=True)
    assert sorted(v.verdict for v in report.verdicts) == ['exempt', 'recovered']
    assert snapshot(conn) == before


def test_grant_refuses_a_job_that_is_gone(conn) -> None:
    reply = verbs.grant(conn, [keys.leases_key('default'), keys.job_key('nope')], ['nope', 30, 'x'])
    assert not reply.granted and reply.deadline == 0
    assert conn.zcard(keys.leases_key('default')) == 0
    assert not conn.exists(keys.job_key('nope'))


def test_uncounted_lease_waits_for_the_restart_grace(conn, server) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, epoch=OTHER_EPOCH)
    counted, _ = start_job(conn, queue)
    report = Sweeper(conn, restart_grace=10**6, max_stalled=3).sweep(['default'])
    assert sorted((v.job_id, v.verdict) for v in report.verdicts) == sorted(
        [(job.id, 'deferred'), (counted.id, 'recovered')]
    )
    assert conn.zscore(keys.leases_key('default'), member) is not None
    expire(conn, 'default', member)


def _fill_primaries(conn: redis.Redis, names: list[str]) -> None:
    """Record earlier primary epochs, the first of ``names`` the oldest."""
    conn.hset(keys.primaries_key(), mapping={name: f'{100 + i}.000000 0' for i, name in enumerate(names)})


def test_the_record_of_primary_epochs_keeps_the_eight_newest(conn) -> None:
    others = [f'{i:040x}:{"0" * 40}' for i in range(8)]
    _fill_primaries(conn, others)
    Sweeper(conn, restart_grace=0).sweep(['default'])
    kept = {name.decode() for name in conn.hkeys(keys.primaries_key())}
    current = [name for name in kept if name.startswith(current_run_id(conn) + ':')]
    assert len(kept) == 8 and len(current) == 1
    assert kept - set(current) == set(others[1:])  # the oldest went


@pytest.mark.parametrize(('oldest', 'verdict'), [(True, 'recovered'), (False, 'deferred')])
def test_an_earlier_term_of_this_process_defers_its_stamps_unless_its_record_was_forgotten(
    conn, oldest: bool, verdict: str
) -> None:
    earlier = f'{current_run_id(conn)}:{"e" * 40}'  # this process, primary before under another replid
    others = [f'{i:040x}:{"0" * 40}' for i in range(7)]
    _fill_primaries(conn, [earlier, *others] if oldest else [*others, earlier])
    job, _ = start_job(conn, Queue('default', connection=conn))
    report = Sweeper(conn, restart_grace=10**6, max_stalled=3).sweep(['default'])
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, verdict)]


def test_deferred_leases_are_reported_once_and_do_not_hide_the_leases_behind_them(conn, server) -> None:
    """A full batch of deferred leases in front: each is reported once, and the counted ones behind are judged."""
    queue = Queue('default', connection=conn)
    batch = 4
    uncounted = [start_job(conn, queue, epoch=OTHER_EPOCH) for _ in range(batch + 2)]
    deferred = [job.id for job, _ in uncounted]
    seconds, micros = conn.time()
    # The counted leases expire later than every deferred one, so they sit behind them.
    counted = []
    for _ in range(3):
        job, member = start_job(conn, queue, expired=False)
        conn.zadd(keys.leases_key('default'), {member: seconds + micros / 1e6 - 0.5}, xx=True)
        counted.append(job.id)
    for _, member in uncounted:  # deadlines well before the counted ones
        conn.zadd(keys.leases_key('default'), {member: seconds - 10}, xx=True)

    report = Sweeper(conn, restart_grace=10**6, max_stalled=3, batch_size=batch).sweep(['default'])

    assert Counter(v.job_id for v in report.verdicts) == Counter(deferred + counted)  # each lease once
    assert sorted(v.job_id for v in report.verdicts if v.verdict == 'deferred') == sorted(deferred)
    assert sorted(v.job_id for v in report.verdicts if v.verdict == 'recovered') == sorted(counted)
    assert conn.zcard(keys.leases_key('default')) == len(deferred)
    assert conn.hget(keys.stats_key('default'), 'recovered') == b'3'
