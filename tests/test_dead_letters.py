"""Dead letters that RQ users can work with, and a sweep that never loses a side effect."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rq import Callback
from rq.intermediate_queue import IntermediateQueue
from rq.job import Dependency, JobStatus
from rq.queue import Queue as StockQueue
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.timeouts import TimerDeathPenalty
from rq.worker import Worker as StockWorker

from rq_epoch import DeadLetters, Job, Queue, StalledJobError, Sweeper, compat
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for
from tests.leases import start_job


def run_pill_until_dead(conn, queue: Queue, pill: Job, start_worker, attempts: int = 6) -> list:
    workers = []
    for _ in range(attempts):
        if pill.get_status(refresh=True) == JobStatus.FAILED:
            break
        worker = start_worker(queue.name)
        workers.append(worker)
        wait_for(
            lambda w=worker: w.proc.poll() is not None or pill.get_status(refresh=True) == JobStatus.FAILED,
            40,
            what='the pill taking its worker down',
        )
    wait_for(lambda: pill.get_status(refresh=True) == JobStatus.FAILED, 30, what='pill dead-lettered')
    wait_for(lambda: conn.zscore(keys.finishing_key(), f'{queue.name}|{pill.id}') is None, 30, what='side effects run')
    return workers


def test_poison_pill_becomes_an_ordinary_failed_job(conn, server, start_worker, tmp_path: Path) -> None:
    queue = Queue('dl', connection=conn)
    log = tmp_path / 'log'
    pill = queue.enqueue(
        'tests.jobs.poison_pill', str(log), 'pill', max_stalled=2, on_failure=Callback('tests.jobs.on_failure_record')
    )
    dependent = queue.enqueue(
        'tests.jobs.record', str(log), 'dependent', depends_on=Dependency(jobs=[pill], allow_failure=True)
    )
    workers = run_pill_until_dead(conn, queue, pill, start_worker)
    pill = Job.fetch(pill.id, connection=conn)
    assert pill.stalled == 2
    assert log.read_text().count('start pill') == 2
    assert pill.id in FailedJobRegistry('dl', connection=conn)
    result = pill.latest_result()
    assert result is not None and result.type == result.Type.FAILED
    assert 'stalled 2 time(s) (max_stalled 2)' in (result.exc_string or '')
    assert server.run_id() in (result.exc_string or '')
    assert len(pill.results()) == 1
    calls = conn.lrange(f'test:on_failure:{pill.id}', 0, -1)
    assert len(calls) == 1 and calls[0].startswith(b'StalledJobError')
    assert 0 < conn.ttl(pill.key)  # RQ's failure TTL applies
    workers.append(start_worker('dl', burst=True))
    wait_for(lambda: dependent.get_status(refresh=True) == JobStatus.FINISHED, 30, what='dependent ran')
    for worker in workers:
        worker.stop()
    assert 'dependent' in log.read_text()

    # rq requeue (the stock CLI) puts it back with a fresh budget
    out = subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'requeue', '--url', server.url, '--queue', 'dl', pill.id],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    pill = Job.fetch(pill.id, connection=conn)
    assert pill.get_status() == JobStatus.QUEUED
    assert pill.stalled == 0
    assert queue.get_job_ids() == [pill.id]
    worker = start_worker('dl')
    wait_for(lambda: worker.proc.poll() is not None, 40, what='the pill taking its worker down again')
    report = wait_for(
        lambda: (r := Sweeper(conn, restart_grace=0).sweep(['dl'])).total and r, 20, what='the stall swept'
    )
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(pill.id, 'recovered', 1)]


def test_sweeper_killed_before_side_effects_is_finished_by_the_next_sweep(conn, server) -> None:
    queue = Queue('crash', connection=conn)
    log_key = 'test:on_failure'
    job, _ = start_job(conn, queue, max_stalled=1, on_failure=Callback('tests.jobs.on_failure_record'))
    dependent = queue.enqueue('tests.jobs.add', 1, 1, depends_on=Dependency(jobs=[job], allow_failure=True))
    proc = subprocess.run(
        [sys.executable, '-m', 'tests.workers', server.url, 'crash'], cwd=ROOT, timeout=60, capture_output=True
    )
    assert proc.returncode == -9  # SIGKILLed at the hook
    # the verdict is durable: failed, in the registry, awaiting its side effects
    assert conn.hget(job.key, 'status') == b'failed'
    assert job.id in FailedJobRegistry('crash', connection=conn)
    assert conn.zscore(keys.finishing_key(), f'crash|{job.id}') is not None
    assert conn.llen(f'{log_key}:{job.id}') == 0
    assert dependent.get_status(refresh=True) == JobStatus.DEFERRED

    report = Sweeper(conn, restart_grace=0).sweep(['crash'])
    assert report.finished == [job.id]
    assert conn.llen(f'{log_key}:{job.id}') == 1
    assert dependent.get_status(refresh=True) == JobStatus.QUEUED
    assert len(Job.fetch(job.id, connection=conn).results()) == 1
    Sweeper(conn, restart_grace=0).sweep(['crash'])  # nothing left to finish
    assert conn.llen(f'{log_key}:{job.id}') == 1
    assert len(Job.fetch(job.id, connection=conn).results()) == 1
    assert conn.zcard(keys.finishing_key()) == 0


def test_job_stranded_in_intermediate_queue_is_requeued_uncounted(conn, start_worker, tmp_path: Path) -> None:
    queue = Queue('limbo', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.record', str(log), 'limbo', max_stalled=1)
    dying = start_worker('limbo', worker_class='tests.workers.EpochWorkerDiesAfterDequeue')
    wait_for(lambda: dying.proc.poll() is not None, 30, what='worker killed after taking the job')
    assert conn.lrange(queue.intermediate_queue_key, 0, -1) == [job.id.encode()]
    assert conn.hget(job.key, 'status') == b'queued'
    start_worker('limbo')  # sweeps on its own; after one lease length the job is requeued
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='job finished by another worker')
    job = Job.fetch(job.id, connection=conn)
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    assert log.read_text().count('limbo') == 1
    assert conn.llen(queue.intermediate_queue_key) == 0


def test_stock_rq_fails_the_same_stranded_job(conn, start_worker, tmp_path: Path) -> None:
    queue = StockQueue('stocklimbo', connection=conn)
    job = queue.enqueue('tests.jobs.record', str(tmp_path / 'log'), 'limbo')
    dying = start_worker('stocklimbo', worker_class='tests.workers.StockWorkerDiesAfterDequeue')
    wait_for(lambda: dying.proc.poll() is not None, 30, what='stock worker killed after taking the job')
    intermediate = IntermediateQueue(queue.key, connection=conn)
    worker = StockWorker([queue], connection=conn)
    intermediate.cleanup(worker, queue)  # first sighting
    seconds, _ = conn.time()
    conn.set(intermediate.get_first_seen_key(job.id), seconds - 120)  # as one of its sweeps would a minute on
    intermediate.cleanup(worker, queue)
    assert job.get_status(refresh=True) == JobStatus.FAILED


def test_finished_job_with_a_leftover_lease_is_settled_and_keeps_its_result(conn, start_worker, tmp_path) -> None:
    queue = Queue('left', connection=conn)
    job = queue.enqueue('tests.jobs.add', 20, 22)
    start_worker('left', burst=True)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='job finished')
    # the stock race (rq#1507/#2424): a lease entry left behind by a finished job
    seconds, _ = conn.time()
    conn.zadd(keys.leases_key('left'), {job.id: seconds - 1})
    report = Sweeper(conn, restart_grace=0).sweep(['left'])
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'settled')]
    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.FINISHED
    assert job.return_value() == 42
    assert job.id in FinishedJobRegistry('left', connection=conn)
    assert job.id not in FailedJobRegistry('left', connection=conn)


def test_each_verdict_is_one_log_line_and_the_report_serialises(conn, caplog) -> None:
    import json

    queue = Queue('logs', connection=conn)
    job, _ = start_job(conn, queue)
    with caplog.at_level(logging.INFO, logger='rq_epoch'):
        report = Sweeper(conn, restart_grace=0, max_stalled=3).sweep(['logs'])
    lines = [r.getMessage() for r in caplog.records if 'verdict' in r.getMessage()]
    run_id = report.run_id
    expected = f'sweep: job {job.id} queue logs verdict recovered stalled 1/3 lease_epoch {run_id} run_id {run_id}'
    assert lines == [expected]
    data = json.loads(json.dumps(report.to_dict()))
    assert data['queues']['logs']['recovered'] == 1
    assert data['verdicts'][0]['job_id'] == job.id


def test_each_dead_letter_is_one_log_line_of_its_own_made_when_it_is_logged(conn, caplog) -> None:
    queue = Queue('deadlogs', connection=conn)
    job_ids = [start_job(conn, queue, max_stalled=1)[0].id for _ in range(3)]
    sweeper = Sweeper(conn, restart_grace=0)
    with caplog.at_level(logging.ERROR, logger='rq_epoch'):
        sweeper.sweep(['deadlogs'])
    records = [r for r in caplog.records if 'dead-lettered to FailedJobRegistry' in r.getMessage()]
    assert sorted(r.args[0] for r in records) == sorted(job_ids)
    assert all(
        r.getMessage().startswith(f'sweep: job {r.args[0]} dead-lettered to FailedJobRegistry of deadlogs: ')
        and 'StalledJobError: job stalled 1 time(s) (max_stalled 1)' in r.args[2]
        for r in records
    )
    assert {(r.funcName, Path(r.pathname).name) for r in records} == {('log_dead_letter', 'deadletters.py')}

    # Called by itself (a subclass, a tool), each line is a record of its own, made when it is logged.
    caplog.clear()
    job = Job.fetch(job_ids[0], connection=conn)
    with caplog.at_level(logging.ERROR, logger='rq_epoch'):
        sweeper.log_dead_letter(job, 'deadlogs', 'first')
        first = caplog.records[-1].created
        wait_for(lambda: time.time() > first + 0.005, 5, what='the clock moving on')
        sweeper.log_dead_letter(job, 'deadlogs', 'second')
    assert [r.args[2] for r in caplog.records] == ['first', 'second']
    assert caplog.records[1].created > first


def results_and_callbacks(conn, job_ids: list[str]) -> tuple[list[int], list[int]]:
    """Failure Results and on_failure calls per job (tests.jobs.on_failure_record)."""
    results = [len(Job.fetch(job_id, connection=conn).results()) for job_id in job_ids]
    calls = [conn.llen(f'test:on_failure:{job_id}') for job_id in job_ids]
    return results, calls


@pytest.mark.parametrize('written', ['finishing set', 'job hash'])
def test_a_write_during_the_batch_transaction_records_each_dead_letter_once(conn, written: str) -> None:
    """Another sweeper's claim (the finishing set) leaves the batch's transaction alone; a write
    to one of its jobs makes it fall back to one transaction per job; either way, once each."""
    queue = Queue('moved', connection=conn)
    job_ids = [
        start_job(conn, queue, max_stalled=1, on_failure=Callback('tests.jobs.on_failure_record'))[0].id
        for _ in range(5)
    ]
    other = redis.Redis(connection_pool=conn.connection_pool)
    unrelated = 'elsewhere|not-a-job'
    writes: list[int] = []
    fallbacks: list[str] = []

    class DeadLettersWithAConcurrentWrite(DeadLetters):
        @staticmethod
        def _queue_failure(pipeline, job, reason) -> None:  # noqa: ANN001 - the base's signature
            if not writes:  # the first job of the batch, inside the watched transaction
                if written == 'finishing set':
                    writes.append(other.zadd(keys.finishing_key(), {unrelated: 4_000_000_000}))
                else:
                    writes.append(other.hset(job.key, 'touched', '1'))
            DeadLetters._queue_failure(pipeline, job, reason)

        def _record_failure(self, job, member, reason) -> bool:  # noqa: ANN001 - the base's signature
            fallbacks.append(job.id)
            return super()._record_failure(job, member, reason)

    class SweeperWithAConcurrentWrite(Sweeper):
        dead_letters_class = DeadLettersWithAConcurrentWrite

    report = SweeperWithAConcurrentWrite(conn, restart_grace=0).sweep(['moved'])
    assert writes == [1]
    assert len(fallbacks) == (0 if written == 'finishing set' else 5)
    assert sorted(report.finished) == sorted(job_ids)
    assert results_and_callbacks(conn, job_ids) == ([1] * 5, [1] * 5)
    assert all(Job.fetch(j, connection=conn).get_status() == JobStatus.FAILED for j in job_ids)
    left = [unrelated.encode()] if written == 'finishing set' else []
    assert conn.zrange(keys.finishing_key(), 0, -1) == left


#: One sweeper process for the test below: sweeps a queue, prints the jobs it finished.
SWEEPER = """
import json, sys
import redis
from rq_epoch import Sweeper
report = Sweeper(redis.Redis.from_url(sys.argv[1]), restart_grace=0, batch_size=20).sweep([sys.argv[2]])
print(json.dumps(report.finished))
"""


def test_concurrent_sweepers_finish_each_dead_letter_once(conn, server) -> None:
    queue = Queue('crowd', connection=conn)
    job_ids = [
        start_job(conn, queue, max_stalled=1, on_failure=Callback('tests.jobs.on_failure_record'))[0].id
        for _ in range(300)
    ]
    dependents = [
        queue.enqueue('tests.jobs.add', 1, 1, depends_on=Dependency(jobs=[parent], allow_failure=True)).id
        for parent in job_ids[::10]
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', SWEEPER, server.url, 'crowd'], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4
    finished = [job_id for out in outputs for job_id in json.loads(out.strip().splitlines()[-1])]
    assert sorted(finished) == sorted(job_ids)
    assert results_and_callbacks(conn, job_ids) == ([1] * 300, [1] * 300)
    assert conn.zcard(keys.finishing_key()) == 0
    # RQ 3 parks dependents in its ReadyJobRegistry first; concurrent pushes onto one queue
    # leave some there for the registry's cleanup (a worker's maintenance), as with stock workers.
    for registry in _ready_registries('crowd', conn):
        registry.cleanup()
    assert sorted(queue.get_job_ids()) == sorted(dependents)


def _ready_registries(name: str, conn) -> list:
    """RQ 3's ReadyJobRegistry of queue ``name`` (dependents moved there before their push); none on RQ 2."""
    return [c(name, connection=conn) for c in compat.MAINTAINED_REGISTRIES if c.__name__ == 'ReadyJobRegistry']


def _dead_letters_with_dependents(conn, queue: Queue, n: int, every: int) -> tuple[list[str], list[str]]:
    job_ids = [start_job(conn, queue, max_stalled=1)[0].id for _ in range(n)]
    dependents = [
        queue.enqueue('tests.jobs.add', 1, 1, depends_on=Dependency(jobs=[parent], allow_failure=True)).id
        for parent in job_ids[::every]
    ]
    return job_ids, dependents


def test_a_batch_of_dead_letters_enqueues_every_dependent_it_made_ready(conn) -> None:
    """On RQ 3 the dependents of a batch are moved to the ready registry job by job and
    pushed together: none may be left behind, none pushed twice."""
    queue = Queue('batch', connection=conn)
    job_ids, dependents = _dead_letters_with_dependents(conn, queue, 60, 4)
    report = Sweeper(conn, restart_grace=0).sweep(['batch'])
    assert sorted(report.finished) == sorted(job_ids)
    assert sorted(queue.get_job_ids()) == sorted(dependents)  # each once, no cleanup of the ready registry needed
    for registry in _ready_registries('batch', conn):  # RQ 3 only
        assert registry.get_job_ids() == []
    assert {Job.fetch(d, connection=conn).get_status() for d in dependents} == {JobStatus.QUEUED}


class CountingQueue(Queue):
    parents: list[str] = []

    def enqueue_dependents(self, job, *args, **kwargs):  # type: ignore[no-untyped-def]
        CountingQueue.parents.append(job.id)
        return super().enqueue_dependents(job, *args, **kwargs)


class CountingSweeper(Sweeper):
    queue_class = CountingQueue


def test_a_queue_class_that_overrides_enqueue_dependents_is_called_for_each_dead_letter_with_dependents(conn) -> None:
    queue = Queue('counted', connection=conn)
    job_ids, dependents = _dead_letters_with_dependents(conn, queue, 12, 3)
    CountingQueue.parents = []
    CountingSweeper(conn, restart_grace=0).sweep(['counted'])
    assert sorted(CountingQueue.parents) == sorted(job_ids[::3])
    assert sorted(queue.get_job_ids()) == sorted(dependents)


@pytest.mark.parametrize('sweeper', [Sweeper, CountingSweeper], ids=['stock queue class', 'own enqueue_dependents'])
@pytest.mark.parametrize('second_queue', ['twice', 'twice-other'], ids=['one queue', 'two queues'])
def test_a_dependent_of_two_dead_letters_of_one_batch_is_enqueued_once(conn, sweeper, second_queue) -> None:
    """The sweep fails both in the server before either's side effects run: the second must
    not enqueue again what the first one did (RQ's function does not look at the dependent)."""
    queue = Queue('twice', connection=conn)
    first = start_job(conn, queue, max_stalled=1)[0]
    second = start_job(conn, Queue(second_queue, connection=conn), max_stalled=1)[0]
    dependent = queue.enqueue('tests.jobs.add', 1, 1, depends_on=Dependency(jobs=[first, second], allow_failure=True))
    report = sweeper(conn, restart_grace=0).sweep(['twice', second_queue])
    assert sorted(report.finished) == sorted([first.id, second.id])
    assert queue.get_job_ids() == [dependent.id]
    assert Job.fetch(dependent.id, connection=conn).get_status() == JobStatus.QUEUED


class WordedDeadLetters(DeadLetters):
    """Dead letters with a failure text and a log of their own."""

    logged: list[tuple[str, str, str]] = []

    def failure_reason(self, job: Job, max_stalled: int, epochs: object = None, at: str | None = None) -> str:
        return f'gave up on {job.id} after {max_stalled}'

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        WordedDeadLetters.logged.append((job.id, queue_name, reason))


class WordedSweeper(Sweeper):
    dead_letters_class = WordedDeadLetters


def test_the_dead_letters_class_of_a_sweeper_words_and_logs_its_dead_letters(conn, caplog) -> None:
    queue = Queue('worded', connection=conn)
    job, _ = start_job(conn, queue, max_stalled=1, on_failure=Callback('tests.jobs.on_failure_record'))
    WordedDeadLetters.logged = []
    sweeper = WordedSweeper(conn, restart_grace=0)
    assert type(sweeper.dead_letters) is WordedDeadLetters
    with caplog.at_level(logging.ERROR, logger='rq_epoch'):
        report = sweeper.sweep(['worded'])
    assert report.finished == [job.id]
    reason = f'gave up on {job.id} after 1'
    assert WordedDeadLetters.logged == [(job.id, 'worded', reason)]
    assert not [r for r in caplog.records if 'dead-lettered to FailedJobRegistry' in r.getMessage()]
    assert Job.fetch(job.id, connection=conn).latest_result().exc_string == reason
    assert conn.lrange(f'test:on_failure:{job.id}', 0, -1) == [f'StalledJobError: {reason}'.encode()]
    assert sweeper.failure_reason(job, 4) == f'gave up on {job.id} after 4'  # the sweeper's asks its dead letters


def test_a_sweeper_subclass_that_overrides_a_dead_letter_hook_is_warned_where_it_is_defined() -> None:
    with pytest.warns(UserWarning, match=r'OldSweeper\.log_dead_letter is not called by the sweep') as caught:

        class OldSweeper(Sweeper):
            def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
                pass

    assert [w.filename for w in caught] == [__file__]
    with pytest.warns(UserWarning, match=r'OldWords\.failure_reason is not called by the sweep'):

        class OldWords(Sweeper):
            def failure_reason(self, job: Job, max_stalled: int, epochs: object = None, at: str | None = None) -> str:
                return 'old'


def test_the_sweepers_arguments_are_those_of_its_dead_letters(conn) -> None:
    def handler(*args: object) -> None:
        pass

    sweeper = CountingSweeper(
        conn,
        max_stalled=5,
        serializer='rq.serializers.JSONSerializer',
        claim_ttl=7,
        exception_handlers=[handler],
        death_penalty_class=TimerDeathPenalty,
    )
    dead_letters = sweeper.dead_letters
    assert (dead_letters.connection, dead_letters.max_stalled, dead_letters.claim_ttl) == (conn, 5, 7)
    assert (dead_letters.job_class, dead_letters.queue_class) == (Job, CountingQueue)
    assert dead_letters.serializer is sweeper.serializer and dead_letters.serializer.__name__ == 'JSONSerializer'
    assert dead_letters.exception_handlers == [handler]
    assert dead_letters.death_penalty_class is TimerDeathPenalty
    assert Sweeper(conn).dead_letters.death_penalty_class is Sweeper.death_penalty_class


def test_the_exception_handlers_run_for_each_dead_letter_until_one_says_stop(conn) -> None:
    queue = Queue('handled', connection=conn)
    job_ids = sorted(start_job(conn, queue, max_stalled=1)[0].id for _ in range(3))
    calls: list[tuple[str, str, object]] = []

    def first(job: Job, exc_type: type, exc: BaseException, tb: object) -> bool:
        calls.append(('first', job.id, exc_type))
        return False  # RQ's rule: the next handlers are not called

    def second(job: Job, exc_type: type, exc: BaseException, tb: object) -> None:
        calls.append(('second', job.id, exc_type))

    report = Sweeper(conn, restart_grace=0, exception_handlers=[first, second]).sweep(['handled'])
    assert sorted(report.finished) == job_ids
    assert sorted(calls) == [('first', job_id, StalledJobError) for job_id in job_ids]


class SweeperThatLeavesItsDeadLetters(Sweeper):
    def finish_dead_letters(self, report: object = None, limit: int = 1000) -> list[str]:
        return []


def test_dead_letters_on_their_own_finish_what_a_sweep_left(conn) -> None:
    queue = Queue('leftover', connection=conn)
    job, _ = start_job(conn, queue, on_failure=Callback('tests.jobs.on_failure_record'))  # no budget of its own
    report = SweeperThatLeavesItsDeadLetters(conn, restart_grace=0, max_stalled=1).sweep(['leftover'])
    assert [v.verdict for v in report.verdicts] == ['dead'] and report.finished == []
    assert conn.zscore(keys.finishing_key(), f'leftover|{job.id}') is not None

    assert DeadLetters(conn, max_stalled=1).finish() == [job.id]
    result = Job.fetch(job.id, connection=conn).latest_result()
    assert 'StalledJobError: job stalled 1 time(s) (max_stalled 1)' in (result.exc_string or '')
    assert conn.llen(f'test:on_failure:{job.id}') == 1
    assert conn.zcard(keys.finishing_key()) == 0
    assert DeadLetters(conn, max_stalled=1).finish() == []
