"""``rq-epoch demo``: the same story played by rq-epoch workers and by stock RQ workers.

The story (see :mod:`rq_epoch.demo.story`) is played with real ``rq worker`` processes on a
real server, first by rq-epoch's workers, then by stock RQ workers; then the demo prints a
ledger per job, for each kind of worker, side by side.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import click
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from ..compat import text as _text
from ..errors import RqEpochError
from ..protocol import keys
from ..protocol.server import read_epoch
from .common import SWEEP_EVERY, DemoError
from .ledger import print_ledger, print_side_by_side
from .processes import Processes, interruptible, start_server
from .story import Story

__all__ = ['Demo', 'run_demo']


class Demo:
    """Runs both stories and prints the ledgers."""

    def __init__(self, url: str | None, stock: bool, echo: Callable[[str], None]) -> None:
        """Prepare a run: its token, its key prefix and its temporary folder (nothing starts yet)."""
        self.given_url = url
        self.play_stock = stock
        self.echo = echo
        self.token = uuid.uuid4().hex
        self.prefix = f'rq-epoch-demo-{self.token[:6]}'
        self.folder = Path(tempfile.mkdtemp(prefix='rq-epoch-demo-'))
        self.processes = Processes(self.token)
        self.server: Any = None
        self.url = url or ''
        self.connection: redis.Redis = None  # type: ignore[assignment]
        self.run_id = ''
        self.started_at = time.monotonic()
        self.stories: list[Story] = []
        #: Whether a given server already had rq-epoch's record of primary epochs (kept if so).
        self.had_primaries_record = True
        #: Whether it already had rq-epoch's record of life (kept if so).
        self.had_alive_record = True

    def say(self, text: str) -> None:
        """Tell one line of the story, with the time since the demo started."""
        self.echo(f'[{time.monotonic() - self.started_at:5.1f}s] {text}')

    def note(self, text: str) -> None:
        """Print an indented, wrapped note under a heading."""
        for line in textwrap.wrap(text, width=100, initial_indent='        ', subsequent_indent='        '):
            self.echo(line)

    def paragraph(self, text: str) -> None:
        """Print wrapped text."""
        for line in textwrap.wrap(text, width=100):
            self.echo(line)

    def heading(self, text: str) -> None:
        """Print a story's heading."""
        self.echo('')
        self.echo(f'== {text}')

    def act(self, text: str) -> None:
        """Print an act's title."""
        self.echo(f'-- {text}')

    def open(self) -> None:
        """Connect to the given server, or start an embedded one, and introduce the demo."""
        if self.given_url:
            self.connection = redis.Redis.from_url(
                self.given_url, socket_connect_timeout=5, socket_timeout=10, retry=RedisRetry(NoBackoff(), 0)
            )
            read_epoch(self.connection)  # a clear error when INFO is refused
            self.had_primaries_record = bool(self.connection.exists(keys.primaries_key()))
            self.had_alive_record = bool(self.connection.exists(keys.alive_key()))
            info = self.connection.info('server')
            self.echo(f'rq-epoch demo against {self._where()} ({self._version(info)}); it will not be restarted')
        else:
            self.server = start_server(self.folder)
            self.url = self.server.url
            self.connection = redis.Redis.from_url(
                self.url, socket_connect_timeout=2, socket_timeout=10, retry=RedisRetry(NoBackoff(), 0)
            )
            info = self.connection.info('server')
            self.echo(
                f'rq-epoch demo: an embedded {self._version(info)} server at {self.url} (pid {self.server.pid}), '
                f'data in {self.folder}'
            )
        self.run_id = read_epoch(self.connection).run_id
        self.echo(f'server epoch (run_id of the server process): {self.run_id}')
        self.paragraph(
            'Every lease a worker holds names the server process that granted it. When a lease expires, the '
            'sweep counts a stall only if that process is still the one running; a lease that crossed a '
            'restart is requeued uncounted. '
            + (
                'The same story is played twice: by rq-epoch workers, then by stock RQ workers. '
                if self.play_stock
                else ''
            )
            + 'The demo acts as supervisor (a worker that dies is replaced, as systemd would) and as cron '
            f'(it sweeps every {SWEEP_EVERY} s, so each verdict shows as it happens).'
        )

    def _where(self) -> str:
        kwargs = self.connection.connection_pool.connection_kwargs
        return f'{kwargs.get("host", "localhost")}:{kwargs.get("port", 6379)}'

    @staticmethod
    def _version(info: dict[str, Any]) -> str:
        if info.get('valkey_version'):
            return f'Valkey {info["valkey_version"]}'
        return f'Redis {info.get("redis_version", "?")}'

    def run(self) -> int:
        """Play every story and print the ledgers; return the exit status."""
        self.open()
        restart = self.server is not None
        kinds = ['epoch'] + (['stock'] if self.play_stock else [])
        for kind in kinds:
            story = Story(self, kind)
            self.stories.append(story)
            story.play(restart)
            print_ledger(self.echo, story)
        if len(self.stories) == 2:
            print_side_by_side(self.echo, *self.stories)
        return 0

    # -- cleanup

    def remove_keys(self) -> None:
        """Delete every key of this run (names carry the run's prefix), on a server we did not start."""
        conn = self.connection
        if conn is None:
            return
        with suppress(redis.exceptions.RedisError):
            for key in conn.scan_iter(match=f'*{self.prefix}*', count=1000):
                conn.delete(key)
            for story in self.stories:
                conn.srem(keys.queues_key(), keys.queue_key(story.queue_name))
                # The workers' sweep tickets of the run's queues (the hash goes with its last field).
                conn.hdel(keys.tickets_key(), f'at:{story.queue_name}', f'count:{story.queue_name}')
                # The idle workers' turns and watch on the run's queue (named by a hash of it).
                set_id = keys.queue_set_id([keys.queue_key(story.queue_name)])
                conn.delete(
                    keys.turns_key(set_id),
                    keys.sweep_turns_key(set_id),
                    keys.watch_key(set_id),
                    keys.baton_key(set_id),
                )
            for raw in conn.smembers(keys.workers_key()):  # type: ignore[union-attr]
                if self.prefix in _text(raw):
                    conn.srem(keys.workers_key(), raw)
            for member in conn.zrange(keys.finishing_key(), 0, -1):  # type: ignore[union-attr]
                if self.prefix in _text(member):
                    conn.zrem(keys.finishing_key(), _text(member))
            if not self.had_primaries_record:  # the demo's sweeps wrote it
                conn.delete(keys.primaries_key())
            if not self.had_alive_record:  # the demo's heartbeats, grants and sweeps wrote it
                conn.delete(keys.alive_key())

    def close(self) -> int:
        """Stop everything this run started and remove its folder; return how many processes were killed."""
        killed = self.processes.kill_all()
        if self.server is not None:
            with suppress(Exception):
                # SIGTERM: a clean shutdown without waiting on a client's reconnect attempts.
                self.server.kill(signal.SIGTERM)
            with suppress(Exception):
                self.server.close()
        elif self.given_url:
            self.remove_keys()
        if self.connection is not None:
            with suppress(Exception):
                self.connection.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return killed


@contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Keep library log lines (verdicts, RQ's cleanup) out of the narration."""
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate, logger.handlers[:]))
        logger.propagate = False
        logger.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for logger, propagate, handlers in saved:
            logger.propagate = propagate
            logger.handlers = handlers


def run_demo(url: str | None = None, stock: bool = True, echo: Callable[[str], None] = click.echo) -> int:
    """Play the demo; return the exit status (0, or 130 after Ctrl-C).

    Raises:
        DemoError: the story could not be played (no server binary, a step timed out...).
    """
    demo = Demo(url, stock, echo)
    interrupted = False
    try:
        with interruptible(), _quiet_loggers('rq_epoch', 'rq.registry'):
            try:
                return demo.run()
            except KeyboardInterrupt:
                interrupted = True
                return 130
            except DemoError:
                _print_worker_logs(demo)
                raise
            except RqEpochError as exc:
                raise DemoError(str(exc)) from exc
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                raise DemoError(f'cannot reach the server: {exc}') from exc
            except redis.exceptions.RedisError as exc:
                raise DemoError(f'the server refused a command: {exc}') from exc
    finally:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            killed = demo.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if interrupted:
            echo(f'interrupted: stopped {killed} process(es) and removed {demo.folder}')


def _print_worker_logs(demo: Demo) -> None:
    """Print the last lines of every worker's log (after a step that did not happen)."""
    for log in sorted(demo.folder.glob('worker-*.log')):
        lines = log.read_text(errors='replace').splitlines()[-8:]
        click.echo(f'--- last lines of {log.name}', err=True)
        for line in lines:
            click.echo(f'    {line}', err=True)
