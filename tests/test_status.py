"""``rq_epoch.ops.status.read_status``: the status of queues from Python, the document the CLI prints."""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from rq_epoch import EpochSettings, Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.status import read_status
from tests.conftest import ROOT
from tests.leases import current_run_id, start_job

OTHER_EPOCH = 'f' * 40


def _keys(conn: redis.Redis) -> dict[bytes, bytes]:
    return {key: conn.dump(key) for key in conn.keys('*')}


def test_read_status_gives_what_status_json_prints_and_writes_nothing(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    queue = Queue('st', connection=conn)
    start_job(conn, queue, expired=False)
    counted, _ = start_job(conn, queue)
    exempt, _ = start_job(conn, queue, epoch=OTHER_EPOCH)
    before = _keys(conn)

    found = read_status(conn, ['st'], settings=EpochSettings.resolve(environ={}, restart_grace=0, max_stalled=5))

    assert _keys(conn) == before
    assert found.current.run_id == current_run_id(conn)
    st = found.queues['st']
    assert (st['live_leases'], st['expired_leases']) == (1, 2)
    assert st['expired']['recovered'] == 1 and st['expired']['exempt'] == 1
    assert (st['would_be_counted'], st['would_be_exempt']) == (1, 1)
    doc = found.to_dict()
    assert doc['max_stalled'] == 5 and doc['restart_grace'] == 0

    cli = subprocess.run(
        [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()', 'status', '-u', server.url, '-q', 'st']
        + ['--grace', '0', '--max-stalled', '5', '--json'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={'PATH': '/usr/bin:/bin'},
    )
    assert cli.returncode == 0, cli.stderr
    printed = json.loads(cli.stdout)
    assert printed['server']['run_id'] == doc['server']['run_id']
    assert set(printed) == set(doc)
    for field in ('live_leases', 'expired_leases', 'expired', 'would_be_counted', 'would_be_exempt', 'stalled_jobs'):
        assert printed['queues']['st'][field] == st[field], field
    assert {counted.id, exempt.id}.isdisjoint(st['dead_letters'])
