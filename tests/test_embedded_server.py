"""The embedded server starts only when it is the process answering on its port.

A port picked by ``free_port`` is free when picked, not reserved; with many tests starting
servers side by side another process can bind it first. Then a server that picked its own
port picks another, and a port the caller gave is an error, instead of the tests talking to
someone else's server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from rq_epoch.embedded import EmbeddedServer, PortTaken


@pytest.fixture
def squatter(tmp_path: Path):
    """A server of our own that holds a port the next server will be told to use."""
    server = EmbeddedServer('valkey', data_dir=tmp_path / 'squatter').start()
    try:
        yield server
    finally:
        server.close()


def _pid_on(port: int) -> int:
    with redis.Redis(host='127.0.0.1', port=port) as client:
        return int(client.info('server')['process_id'])


def test_a_server_whose_picked_port_was_taken_starts_on_another_port(squatter: EmbeddedServer, tmp_path: Path) -> None:
    server = EmbeddedServer('valkey', data_dir=tmp_path / 'late')
    server.port = squatter.port  # as if another process had bound the port it picked
    try:
        server.start(timeout=15)
        assert server.port != squatter.port
        assert _pid_on(server.port) == server.pid
        assert _pid_on(squatter.port) == squatter.pid
    finally:
        server.close()


def test_a_server_given_a_taken_port_says_so_and_leaves_the_other_server_alone(
    squatter: EmbeddedServer, tmp_path: Path
) -> None:
    server = EmbeddedServer('valkey', data_dir=tmp_path / 'late', port=squatter.port)
    with pytest.raises(PortTaken, match=f'port {squatter.port} is in use'):
        server.start(timeout=15)
    assert server.process is not None and server.process.poll() is not None
    assert _pid_on(squatter.port) == squatter.pid
    server.close()
    assert _pid_on(squatter.port) == squatter.pid
