"""The keys rq-epoch adds follow RQ's key prefix (configurable since RQ 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = """
import sys
import redis
from rq_epoch import Queue, Sweeper, keys
from tests.leases import start_job
conn = redis.Redis.from_url(sys.argv[1])
queue = Queue('pfx', connection=conn)
job, member = start_job(conn, queue)
report = Sweeper(conn, restart_grace=0, max_stalled=3).sweep(['pfx'])
print(keys.PREFIX, queue.key, [str(v.verdict) for v in report.verdicts])
"""


def test_keys_follow_rq_key_prefix(conn, server) -> None:
    try:
        from rq.defaults import RQ_KEY_PREFIX  # noqa: F401
    except ImportError:
        pytest.skip('RQ 2 has a fixed key prefix')
    env = dict(os.environ, RQ_KEY_PREFIX='myapp', PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, '-c', SCRIPT, server.url], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ['myapp', 'myapp:queue:pfx']
    assert "['recovered']" in out.stdout
    names = {k.decode() for k in conn.keys('*')}
    assert 'myapp:epoch:stats:pfx' in names
    assert not any(name.startswith('rq:') for name in names)
    assert conn.lrange('myapp:queue:pfx', 0, -1)  # requeued under the same prefix
