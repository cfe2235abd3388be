"""Guards of the adapters: each contact with RQ's or redis-py's internals still does what rq-epoch relies on.

Every function of ``rq_epoch.adapters`` (see docs/design.md, "Adapters") is exercised here
against a real server with the installed RQ and redis-py, so a release that moves an
internal fails here, by name, before anything built on it misbehaves. CI runs these on
RQ 3.0 with the newest redis-py and on RQ 2.12 with redis-py 5.0.1.
"""

from __future__ import annotations

import inspect
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import rq
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.registry import FailedJobRegistry
from rq.results import Result
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer, resolve_serializer
from rq.timeouts import HorseMonitorTimeoutException, UnixSignalDeathPenalty
from rq.worker import Worker as RQWorker
from rq.worker import WorkerStatus

import rq_epoch
from rq_epoch import Job, Queue, compat
from rq_epoch.adapters import redis_py
from rq_epoch.adapters import rq as rq_adapter
from rq_epoch.embedded import EmbeddedServer

RQ2 = rq.__version__.startswith('2.')
REDIS_PY = tuple(int(part) for part in redis.__version__.split('.')[:3])


@pytest.fixture
def refused() -> Iterator[redis.Redis]:
    """A client of a loopback port that refuses connections (bound, not listening)."""
    holder = socket.socket()
    holder.bind(('127.0.0.1', 0))
    try:
        yield redis.Redis(host='127.0.0.1', port=holder.getsockname()[1], socket_connect_timeout=1)
    finally:
        holder.close()


# -- redis-py: the fenced commit -----------------------------------------------------------


def test_an_intercepted_execute_reads_and_rewrites_the_queued_transaction(conn) -> None:
    seen: list[tuple[list[tuple[Any, ...]], bool]] = []

    class Rewrite(redis_py.ExecuteHandler):
        def __call__(self, raise_on_error: bool = True) -> list[Any]:
            transaction = self.transaction
            commands = transaction.commands
            seen.append(([args for args, _ in commands], transaction.watching))
            transaction.replace_commands(commands[1:])
            transaction.add_command('SET', 'test:added', 'yes')
            return transaction.execute(raise_on_error)

    with conn.pipeline() as pipe:
        handler = redis_py.intercept_execute(pipe, Rewrite)
        assert redis_py.intercept_execute(pipe, Rewrite) is handler
        pipe.watch('test:watched')
        pipe.multi()
        pipe.set('test:dropped', 'x')
        pipe.hset('test:hash', 'field', 'value')
        assert pipe.execute() == [1, True]
        # The handler stays across the reset that ends each execute (RQ retries on one pipeline).
        pipe.set('test:dropped', 'x')
        pipe.incr('test:counter')
        assert pipe.execute() == [1, True]
    assert seen == [
        ([('SET', 'test:dropped', 'x'), ('HSET', 'test:hash', 'field', 'value')], True),
        ([('SET', 'test:dropped', 'x'), ('INCRBY', 'test:counter', 1)], False),
    ]
    assert conn.get('test:dropped') is None
    assert conn.get('test:added') == b'yes'


def test_a_raw_reply_parsed_through_the_transaction_is_what_execute_gives(server: EmbeddedServer, conn) -> None:
    conn.hset('test:hash', mapping={'a': '1'})
    conn.zadd('test:zset', {'m': 1.5})
    with conn.pipeline() as pipe:
        pipe.set('test:string', 'v')
        pipe.hgetall('test:hash')
        pipe.zscore('test:zset', 'm')
        pipe.exists('test:hash')
        commands = redis_py.QueuedTransaction(pipe, pipe.execute).commands
        parsed_by_redis_py = pipe.execute()
        transaction = redis_py.QueuedTransaction(pipe, pipe.execute)
    raw = redis.Connection(host='127.0.0.1', port=server.port)
    try:
        replies = []
        for args, _options in commands:
            raw.send_command(*args)
            replies.append(raw.read_response())
    finally:
        raw.disconnect()
    assert replies[0] == b'OK'  # unparsed: the commit script returns replies like these
    assert [transaction.parse_reply(c, r) for c, r in zip(commands, replies, strict=True)] == parsed_by_redis_py


def test_scripts_queued_through_a_pipeline_are_seen_and_queued_again_after_a_failed_send(conn) -> None:
    script = conn.register_script("return redis.call('INCR', KEYS[1])")
    with conn.pipeline() as pipe:
        transaction = redis_py.QueuedTransaction(pipe, pipe.execute)
        assert not transaction.has_scripts
        script(keys=['test:script'], client=pipe)
        assert transaction.has_scripts and transaction.scripts == {script}
        commands, scripts = transaction.commands, transaction.scripts
        assert pipe.execute() == [1]
        assert not transaction.has_scripts  # redis-py forgets them once it sent the transaction
        transaction.replace_commands(commands)
        transaction.replace_scripts(scripts)
        conn.script_flush()
        assert pipe.execute() == [2]  # loaded again before the transaction went out
    assert conn.get('test:script') == b'2'


def test_a_command_sent_now_goes_on_the_watching_pipelines_connection(conn) -> None:
    with conn.pipeline() as pipe:
        transaction = redis_py.QueuedTransaction(pipe, pipe.execute)
        pipe.watch('test:first')
        assert transaction.watching
        assert transaction.send_now('WATCH', 'test:second') in (True, b'OK')
        assert transaction.send_now('GET', 'test:second') is None
        pipe.multi()
        pipe.set('test:written', '1')
        conn.set('test:second', 'changed')  # another client changes a key the WATCH sent now covers
        with pytest.raises(WatchError):
            pipe.execute()
    assert conn.get('test:written') is None


def test_a_transaction_sent_alone_goes_without_multi_and_leaves_the_pipeline_reset(conn) -> None:
    with conn.pipeline() as pipe:
        transaction = redis_py.QueuedTransaction(pipe, pipe.execute)
        pipe.set('test:alone', '1')
        before = conn.info('commandstats').get('cmdstat_multi', {}).get('calls', 0)
        assert transaction.execute_alone(False) == [True]
        assert conn.info('commandstats').get('cmdstat_multi', {}).get('calls', 0) == before
        assert transaction.commands == []  # reset as execute() resets: nothing is sent twice
        assert pipe.transaction  # the next execute() is a transaction again
        pipe.set('test:after', '2')
        assert pipe.execute() == [True]
        assert conn.info('commandstats')['cmdstat_multi']['calls'] == before + 1
    assert conn.mget('test:alone', 'test:after') == [b'1', b'2']


def test_a_note_stays_with_the_pipeline_across_a_failed_watched_transaction(conn) -> None:
    marker = object()
    with conn.pipeline() as pipe:
        assert redis_py.noted(pipe, 'execution') is None
        redis_py.note(pipe, 'execution', marker)
        pipe.watch('test:key')
        conn.set('test:key', '1')
        pipe.multi()
        pipe.set('test:key', '2')
        with pytest.raises(WatchError):
            pipe.execute()
        assert redis_py.noted(pipe, 'execution') is marker
        assert redis_py.noted(pipe, 'other') is None


# -- redis-py: the failover watch ----------------------------------------------------------


def test_every_connection_of_a_hooked_pool_gets_the_mixin_and_still_reads_replies(server: EmbeddedServer) -> None:
    reads: list[str] = []
    handed_out: list[int] = []

    class Counting:
        def send_command(self, *args: Any, **kwargs: Any) -> Any:
            reads.append(str(args[0]))
            return super().send_command(*args, **kwargs)  # type: ignore[misc]

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            reads.append('read')
            return super().read_response(*args, **kwargs)  # type: ignore[misc]

    classes: dict[type, type] = {}

    def hooked(base: type) -> type:
        return classes.setdefault(base, type(f'Counting{base.__name__}', (Counting, base), {}))

    pool = redis.ConnectionPool(host='127.0.0.1', port=server.port)
    client = redis.Redis(connection_pool=pool)
    try:
        client.ping()  # a connection opened before the hook, back in the pool
        original = pool.connection_class
        redis_py.hook_connections(pool, Counting, hooked, lambda: handed_out.append(1))
        assert pool.connection_class is hooked(original)
        assert redis_py.unhooked_connection_class(pool, Counting) is original
        held = redis.Redis(connection_pool=pool, single_connection_client=True)  # takes the old connection
        opened_before = held.connection
        assert isinstance(opened_before, Counting)  # its class changed as it was handed out
        assert held.set('test:a', '1') and held.get('test:a') == b'1'
        assert client.ping()  # a new connection: the old one is held
        assert len(handed_out) == 2
        assert reads.count('read') >= 3 and 'SET' in reads and 'GET' in reads
        assert redis_py.connections_in_use(pool) == [opened_before]
        sock = redis_py.socket_of(opened_before)
        assert isinstance(sock, socket.socket) and sock.getpeername()[1] == server.port
        held.close()
        assert redis_py.connections_in_use(pool) == []
        opened_before.disconnect()
        assert redis_py.socket_of(opened_before) is None
    finally:
        pool.disconnect()


def test_a_read_is_bounded_per_read_or_on_the_socket(server: EmbeddedServer) -> None:
    """redis-py 5.0.2 and later take a timeout per read; any redis-py reads with the socket's own."""
    assert redis_py.reads_take_timeout(redis.Connection) == (REDIS_PY >= (5, 0, 2))
    connection = redis.Connection(host='127.0.0.1', port=server.port)
    try:
        connection.send_command('BLPOP', 'test:nothing', 5)
        if redis_py.reads_take_timeout(redis.Connection):
            with pytest.raises(RedisTimeoutError):
                connection.read_response(timeout=0.05)
        else:
            with pytest.raises(TypeError):
                connection.read_response(timeout=0.05)
        connection.disconnect()
        connection.send_command('BLPOP', 'test:nothing', 5)
        sock = redis_py.socket_of(connection)
        assert sock is not None
        sock.settimeout(0.05)
        with pytest.raises(RedisTimeoutError):
            connection.read_response()
    finally:
        connection.disconnect()


# -- RQ: jobs ------------------------------------------------------------------------------


def test_an_error_of_the_job_function_is_not_rqs_step_before_it(conn) -> None:
    job = RQJob.create('tests.jobs.raise_connection_error', connection=conn)
    with pytest.raises(redis.exceptions.ConnectionError) as raised:
        job.perform()
    assert not rq_adapter.raised_before_job_function(raised.value)
    assert not rq_adapter.raised_before_job_function(redis.exceptions.ConnectionError('raised elsewhere'))


def test_rqs_step_before_the_job_function_is_found_in_the_traceback(refused: redis.Redis) -> None:
    job = RQJob.create('tests.jobs.add', args=(1, 2), connection=refused)
    if RQ2:  # RQ 2's perform removes the key's expiry before it calls the function
        with pytest.raises(redis.exceptions.ConnectionError) as raised:
            job.perform()
        assert rq_adapter.raised_before_job_function(raised.value)
    else:  # RQ 3's calls no server before the function
        assert job.perform() == 3


def test_a_job_fetched_as_rqs_changes_class_in_place_and_keeps_its_data(conn) -> None:
    rq.Queue('default', connection=conn).enqueue('tests.jobs.add', 1, 2, job_id='adopted')
    job = RQJob.fetch('adopted', connection=conn)
    assert rq_adapter.change_job_class(job, rq_epoch.Job) is job
    assert type(job) is rq_epoch.Job
    assert (job.id, job.args, job.origin, job.func_name) == ('adopted', (1, 2), 'default', 'tests.jobs.add')
    # What the epoch class's __init__ sets is read from class defaults (its __init__ did not run).
    added = set(vars(rq_epoch.Job(connection=conn))) - set(vars(RQJob(connection=conn)))
    assert added and not added & set(vars(job))
    for name in added:
        getattr(job, name)
    assert job.perform() == 3


def test_a_queue_copied_as_a_subclass_is_the_same_queue_and_leaves_the_original_as_it_was(conn) -> None:
    class Marked(rq.Queue):
        marked = True

    queue = rq.Queue('copied', connection=conn, serializer=JSONSerializer, default_timeout=77)
    copied = rq_adapter.queue_copy_as(queue, Marked)
    assert type(copied) is Marked and type(queue) is rq.Queue and copied is not queue
    assert (copied.name, copied.key, copied.connection, copied.job_class) == (
        queue.name,
        queue.key,
        queue.connection,
        queue.job_class,
    )
    assert copied.serializer is queue.serializer
    job = copied.enqueue('tests.jobs.add', 1, 2)
    assert queue.job_ids == [job.id] and job.timeout == 77


def test_dependency_ids_are_those_the_job_was_made_and_fetched_with(conn) -> None:
    queue = rq.Queue('default', connection=conn)
    first, second = queue.enqueue('tests.jobs.add', 1, 2), queue.enqueue('tests.jobs.add', 3, 4)
    dependent = queue.enqueue('tests.jobs.add', 5, 6, depends_on=[first, second])
    assert rq_adapter.dependency_ids(dependent) == [first.id, second.id]
    assert rq_adapter.dependency_ids(RQJob.fetch(dependent.id, connection=conn)) == [first.id, second.id]


def test_a_job_made_from_its_hash_is_the_job_rq_fetches(conn) -> None:
    queue = Queue('adapters-hash', connection=conn)
    job = queue.enqueue('tests.jobs.add', 1, 2, meta={'k': 'v'}, description='d')
    assert rq_adapter.fetches_as_rq(Job) and rq_adapter.fetches_as_rq(RQJob)

    class OwnRefresh(RQJob):
        def refresh(self) -> None:
            super().refresh()

    class OwnFetch(RQJob):
        @classmethod
        def fetch(cls, id: str, connection: Any = None, serializer: Any = None) -> Any:
            return super().fetch(id, connection=connection, serializer=serializer)

    assert not rq_adapter.fetches_as_rq(OwnRefresh) and not rq_adapter.fetches_as_rq(OwnFetch)
    made = rq_adapter.job_from_hash(Job, job.id, conn.hgetall(job.key), conn, None)
    fetched = Job.fetch(job.id, connection=conn)
    assert type(made) is Job
    assert made.to_dict() == fetched.to_dict()
    assert (made.func_name, made.args, made.meta, made.origin) == ('tests.jobs.add', (1, 2), {'k': 'v'}, queue.name)
    with pytest.raises(NoSuchJobError):
        rq_adapter.job_from_hash(Job, 'adapters-gone', {}, conn, None)


def test_a_status_set_locally_is_the_objects_and_not_the_servers(conn) -> None:
    queue = rq.Queue('default', connection=conn)
    job = queue.enqueue('tests.jobs.add', 1, 2)
    rq_adapter.set_local_status(job, JobStatus.DEFERRED)
    assert job.get_status(refresh=False) == JobStatus.DEFERRED
    assert RQJob.fetch(job.id, connection=conn).get_status() == JobStatus.QUEUED


def test_a_job_is_pushed_onto_its_queue_within_a_pipeline(conn) -> None:
    queue = rq.Queue('default', connection=conn)
    back, front = queue.create_job('tests.jobs.add', args=(1, 2)), queue.create_job('tests.jobs.add', args=(3, 4))
    with conn.pipeline() as pipe:
        rq_adapter.push_job(queue, back, pipe, at_front=False)
        rq_adapter.push_job(queue, front, pipe, at_front=True)
        assert queue.job_ids == []  # nothing sent before the pipeline is
        pipe.execute()
    assert queue.job_ids == [front.id, back.id]
    assert RQJob.fetch(back.id, connection=conn).get_status() == JobStatus.QUEUED


def test_a_rate_limited_job_is_pushed_within_a_pipeline(conn) -> None:
    if RQ2:
        pytest.skip('RQ 2 has no rate limits')
    from rq.rate_limit import RateLimit  # type: ignore[import-not-found, unused-ignore]

    queue = rq.Queue('default', connection=conn)
    job = queue.create_job('tests.jobs.add', args=(1, 2), rate_limit=RateLimit('test', 1))
    with conn.pipeline() as pipe:
        rq_adapter.push_rate_limited_job(queue, job, pipe)
        pipe.execute()
    assert queue.job_ids == [job.id]  # a free slot: the job went onto its queue


def test_a_failure_recorded_without_a_worker_fails_the_job(conn) -> None:
    job = rq.Queue('default', connection=conn).enqueue('tests.jobs.add', 1, 2)
    with conn.pipeline() as pipe:
        rq_adapter.record_job_failure(job, 'it broke', pipe)
        pipe.execute()
    job = RQJob.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.FAILED
    assert job.id in FailedJobRegistry('default', connection=conn)
    result = job.latest_result()
    assert result is not None and result.type == Result.Type.FAILED and result.exc_string == 'it broke'


def test_an_execution_gives_the_job_attached_to_it(refused: redis.Redis) -> None:
    job = rq_epoch.Job.create('tests.jobs.add', args=(1, 2), connection=refused)
    execution = Execution('execution-1', job.id, connection=refused)
    rq_adapter.attach_job(execution, job)
    assert execution.job is job  # not fetched: the server is unreachable


# -- RQ: queues and workers ----------------------------------------------------------------


def test_rqs_worker_loop_takes_jobs_through_the_queue_class_dequeue_any(conn) -> None:
    calls: list[tuple[type, list[str], Any, list[str]]] = []

    def dequeue_any(cls: type, queues: list[rq.Queue], timeout: Any, **kwargs: Any) -> Any:
        calls.append((cls, [queue.name for queue in queues], timeout, sorted(kwargs)))
        return rq.Queue.dequeue_any(queues, timeout, **kwargs)

    stand_in = rq_adapter.queue_class_dequeuing_with(rq.Queue, dequeue_any)
    assert issubclass(stand_in, rq.Queue)
    assert (stand_in.__name__, stand_in.__module__) == ('Queue', rq.Queue.__module__)
    job = rq.Queue('default', connection=conn).enqueue('tests.jobs.add', 1, 2)
    worker = RQWorker(['default'], connection=conn, queue_class=stand_in)
    taken, queue = worker.dequeue_job_and_maintain_ttl(None)
    assert (taken.id, queue.name) == (job.id, 'default')
    assert calls == [(stand_in, ['default'], None, ['connection', 'death_penalty_class', 'job_class', 'serializer'])]


def _failing_job(conn: redis.Redis) -> tuple[RQJob, Any]:
    job = RQJob.create('tests.jobs.add', args=(1, 2), connection=conn)
    try:
        raise ValueError('the job failed')
    except ValueError:
        return job, sys.exc_info()


def test_a_workers_exception_handlers_are_read_and_given_to_another(conn) -> None:
    seen: list[tuple[str, type]] = []

    def handler(job: RQJob, exc_type: type, exc_value: BaseException, tb: Any) -> bool:
        seen.append((job.id, exc_type))
        return False

    worker = RQWorker(['default'], connection=conn, exception_handlers=[handler])
    handlers = rq_adapter.exception_handlers(worker)
    assert handlers == [handler]
    worker.push_exc_handler(print)
    assert handlers[-1] is print  # the worker's list itself
    rebuilt = RQWorker(['default'], connection=conn)
    rq_adapter.set_exception_handlers(rebuilt, [handler])
    job, exc_info = _failing_job(conn)
    rebuilt.handle_exception(job, *exc_info)
    assert seen == [(job.id, ValueError)]


def test_the_running_execution_is_read_from_memory_and_leaves_no_stale_cache(conn) -> None:
    """Before an outcome the worker reads its execution; after it, RQ's worker names no job."""
    queue = rq.Queue('default', connection=conn)
    job = queue.enqueue('os.getpid')
    worker = RQWorker([queue], connection=conn)
    worker.register_birth()
    assert rq_adapter.running_execution(worker) is None
    execution = worker.prepare_execution(job)
    assert rq_adapter.running_execution(worker) == execution
    with conn.pipeline() as pipeline:
        if compat.CLEANUP_TAKES_EXECUTION:
            worker.cleanup_execution(job, pipeline=pipeline, execution=execution)
        else:
            worker.cleanup_execution(job, pipeline=pipeline)
            worker.execution = None  # RQ 2's worker lets go of it after the outcome's transaction
        pipeline.execute()
    assert rq_adapter.running_execution(worker) is None
    assert worker.get_current_job_id() is None


def test_a_warm_stop_requested_while_busy_is_seen(conn) -> None:
    worker = RQWorker(['default'], connection=conn)
    assert rq_adapter.stop_requested(worker) is False
    worker.set_state(WorkerStatus.BUSY)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.request_stop(signal.SIGTERM, None)
    finally:
        for number, previous in handlers.items():
            signal.signal(number, previous)
    assert rq_adapter.stop_requested(worker) is True


def test_the_monitors_alarm_is_brought_forward_only_inside_rqs_death_penalty() -> None:
    """RQ's monitor waits under UnixSignalDeathPenalty's SIGALRM: brought forward, it ends the
    wait with RQ's HorseMonitorTimeoutException at once; outside one, nothing is armed."""
    assert rq_adapter.bring_monitor_alarm_forward() is False
    with pytest.raises(HorseMonitorTimeoutException):
        with UnixSignalDeathPenalty(60, HorseMonitorTimeoutException):
            assert rq_adapter.bring_monitor_alarm_forward() is True
            time.sleep(30)  # as wait4 would: only the alarm's exception ends it before the block does
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_horse_pid_set_is_the_one_rq_reports(conn) -> None:
    worker = RQWorker(['default'], connection=conn)
    rq_adapter.set_horse_pid(worker, 4242)
    assert worker.horse_pid == 4242


@pytest.mark.parametrize('serializer', [None, JSONSerializer, 'rq.serializers.JSONSerializer'])
def test_the_serializer_argument_resolves_to_the_workers_serializer(conn, serializer: Any) -> None:
    worker = RQWorker(['default'], connection=conn, serializer=serializer)
    argument = rq_adapter.serializer_argument(worker)
    assert argument is None or isinstance(argument, str)
    assert resolve_serializer(argument) is worker.serializer


def test_the_scheduler_process_is_the_one_rq_started(conn) -> None:
    scheduler = RQScheduler(['default'], connection=conn)
    assert rq_adapter.scheduler_process(scheduler) is None
    scheduler.acquire_locks(auto_start=True)
    process = rq_adapter.scheduler_process(scheduler)
    assert process is not None
    try:
        assert process.is_alive()
    finally:
        process.kill()
        process.join(10)
    assert not process.is_alive()


def test_rq_subscribes_with_the_pubsub_exception_handler_rq_epoch_overrides(conn) -> None:
    """rq_epoch.Worker overrides RQ's private ``_pubsub_exception_handler`` (worker.py): RQ still
    gives that method to the pubsub thread, with the same parameters."""
    ours = inspect.signature(rq_epoch.Worker._pubsub_exception_handler).parameters
    assert list(inspect.signature(RQWorker._pubsub_exception_handler).parameters) == list(ours)
    worker = rq_epoch.Worker(['default'], connection=conn)
    worker.subscribe()
    try:
        assert worker.pubsub_thread is not None
        handler = worker.pubsub_thread.exception_handler
        assert getattr(handler, '__func__', None) is rq_epoch.Worker._pubsub_exception_handler
    finally:
        worker.unsubscribe()
