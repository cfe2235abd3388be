"""RQ's commands to a worker (``rq.command``) still reach it after its pubsub connection met a
server that did not answer in time.

RQ's worker listens for commands (shutdown, kill the work-horse, stop the job) on a pubsub
connection in a thread of its own, and RQ's handler of that thread's errors rides out a
connection error but ends the thread on any other error. rq-epoch's worker gives each
non-blocking command a bounded time to answer (the command timeout, at least 2 s), so a server
that answers late raises a timeout there: for instance in the handshake of the pubsub
connection as it connects again. The thread must ride that out like a dropped connection,
or the worker hears no command again.

A real worker behind a loopback proxy: its pubsub connection is closed by the server
(``CLIENT KILL TYPE pubsub``), and the proxy holds the first write of the connection that
replaces it (redis-py's ``CLIENT SETINFO``) for longer than the command timeout.
"""

from __future__ import annotations

import pytest
from rq import Worker as RQWorker
from rq.command import PUBSUB_CHANNEL_TEMPLATE, send_shutdown_command

from tests.conftest import wait_for


def subscribers(conn, channel: str) -> int:
    return int(conn.pubsub_numsub(channel)[0][1])


def worker_name(conn) -> str | None:
    workers = RQWorker.all(connection=conn)
    return workers[0].name if workers else None


def test_a_late_answer_while_the_pubsub_connection_reconnects_does_not_end_the_command_thread(
    conn, proxy, start_worker
) -> None:
    worker = start_worker('late', url=proxy.url)
    name = wait_for(lambda: worker_name(conn), 30, what='the worker registered')
    channel = PUBSUB_CHANNEL_TEMPLATE % name
    wait_for(lambda: subscribers(conn, channel) == 1, 30, what='the worker listening for commands')
    proxy.hold(b'SETINFO')
    conn.client_kill_filter(_type='pubsub')
    assert proxy.held.wait(30), 'the pubsub connection never connected again'
    # Held past the command timeout (2 s): the handshake's read times out in the worker.
    wait_for(lambda: 'Timeout reading' in worker.output(), 20, what='the late answer met by the pubsub thread')
    proxy.release()
    try:
        wait_for(lambda: subscribers(conn, channel) == 1, 30, what='the worker listening for commands again')
        send_shutdown_command(conn, name)
        wait_for(lambda: worker.proc.poll() is not None, 30, what='the worker to obey the command')
    except pytest.fail.Exception as exc:
        pytest.fail(f'{exc}\n{worker.output()}')
    assert worker.proc.returncode == 0
    assert 'pubsub thread exiting' not in worker.output()
