"""The epoch rule: the test vectors of docs/design.md, in Python and in the server's scripts."""

from __future__ import annotations

import pytest

from rq_epoch import Queue, Sweeper
from rq_epoch.protocol import epoch

NOW = '3f2c0d8e9b1a4c5d6e7f8091a2b3c4d5e6f70812'
INVALID = ['', NOW[:-1], NOW.upper(), NOW[:-1] + 'g', NOW + '0']
EXEMPT_WHEN_NOW = [None, '0000000000000000000000000000000000000000', '']


def test_now_is_a_valid_run_id() -> None:
    assert epoch.is_valid_run_id(NOW)
    assert epoch.is_valid_run_id(NOW.encode())


@pytest.mark.parametrize('value', INVALID, ids=['empty', 'short', 'upper', 'g', 'long'])
def test_invalid_run_ids_are_rejected(value: str) -> None:
    assert not epoch.is_valid_run_id(value)


def test_none_is_not_a_run_id() -> None:
    assert not epoch.is_valid_run_id(None)


def test_lease_of_the_current_process_is_counted() -> None:
    assert epoch.is_counted(NOW, NOW)
    assert not epoch.is_exempt(NOW, NOW)


@pytest.mark.parametrize('stamp', EXEMPT_WHEN_NOW, ids=['missing', 'zeros', 'empty'])
def test_missing_or_foreign_stamp_is_exempt(stamp: str | None) -> None:
    assert epoch.is_exempt(stamp, NOW)
    assert not epoch.is_counted(stamp, NOW)


@pytest.mark.parametrize('stamp', INVALID[1:], ids=['short', 'upper', 'g', 'long'])
def test_near_misses_of_the_current_id_are_exempt(stamp: str) -> None:
    assert epoch.is_exempt(stamp, NOW)


def test_parse_run_id_reads_info_text() -> None:
    text = f'# Server\r\nredis_version:7.0.15\r\nrun_id:{NOW}\r\ntcp_port:6379\r\n'
    assert epoch.parse_run_id(text) == NOW
    assert epoch.parse_run_id('# Server\r\n') is None


# The same rule, applied by the sweep script on a real server.


@pytest.mark.parametrize(
    'stamp_kind, verdict',
    [
        ('current', 'recovered'),
        ('missing', 'exempt'),
        ('zeros', 'exempt'),
        ('empty', 'exempt'),
        ('upper', 'exempt'),
        ('short', 'exempt'),
        ('long', 'exempt'),
    ],
)
def test_sweep_script_applies_the_rule(conn, stamp_kind: str, verdict: str) -> None:
    from tests.leases import CURRENT, current_run_id, start_job

    now = current_run_id(conn)
    stamps = {
        'current': CURRENT,
        'missing': None,
        'zeros': '0' * 40,
        'empty': '',
        'upper': now.upper(),
        'short': now[:-1],
        'long': now + '0',
    }
    queue = Queue('rule', connection=conn)
    job, _ = start_job(conn, queue, epoch=stamps[stamp_kind])
    report = Sweeper(conn, max_stalled=3, restart_grace=0).sweep(['rule'])
    assert [v.verdict for v in report.verdicts] == [verdict]
    job.refresh()
    assert job.stalled == (1 if verdict == 'recovered' else 0)
    assert job.exempt_recoveries == (1 if verdict == 'exempt' else 0)


# "Last seen alive": a lease stamped by another process counts when that process was seen
# serving as primary after the lease's deadline (both its own TIME), within the same term.

OTHER = 'a' * 40
DEADLINE = 1000.0
# (record "<last> <replid> <first>" of OTHER or None, lease stamp, counted?)
SEEN_ALIVE_VECTORS = [
    ('after', f'1002.000000 {"b" * 40} 900.000000', OTHER, True),
    ('just-after', f'{DEADLINE + 0.5:.6f} {"b" * 40} 900.000000', OTHER, True),
    ('within-margin', f'{DEADLINE + epoch.ALIVE_MARGIN / 2:.6f} {"b" * 40} 900.000000', OTHER, False),
    ('at-deadline', f'{DEADLINE:.6f} {"b" * 40} 900.000000', OTHER, False),
    ('before', f'999.000000 {"b" * 40} 900.000000', OTHER, False),
    ('term-began-after', f'1002.000000 {"b" * 40} 1000.500000', OTHER, False),
    ('no-record', None, OTHER, False),
    ('malformed', 'soon', OTHER, False),
    ('another-process-record', f'1002.000000 {"b" * 40} 900.000000', '0' * 40, False),
    ('missing-stamp', f'1002.000000 {"b" * 40} 900.000000', None, False),
    ('empty-stamp', f'1002.000000 {"b" * 40} 900.000000', '', False),
]
VECTOR_IDS = [v[0] for v in SEEN_ALIVE_VECTORS]


@pytest.mark.parametrize('case, record, stamp, counted', SEEN_ALIVE_VECTORS, ids=VECTOR_IDS)
def test_seen_alive_after_the_deadline_counts(case: str, record: str | None, stamp: str | None, counted: bool) -> None:
    # The record is OTHER's: a stamp naming another process has no record here.
    seen = epoch.parse_seen_alive(record) if stamp == OTHER else None
    assert epoch.is_counted(stamp, NOW, deadline=DEADLINE, seen_alive=seen) is counted
    assert epoch.is_exempt(stamp, NOW, deadline=DEADLINE, seen_alive=seen) is not counted


def test_the_current_process_counts_whatever_its_record() -> None:
    before = epoch.parse_seen_alive(f'999.000000 {"b" * 40} 900.000000')
    assert epoch.is_counted(NOW, NOW, deadline=DEADLINE, seen_alive=before)


@pytest.mark.parametrize('case, record, stamp, counted', SEEN_ALIVE_VECTORS, ids=VECTOR_IDS)
def test_sweep_script_counts_by_the_record_of_life(
    conn, case: str, record: str | None, stamp: str | None, counted: bool
) -> None:
    """The same vectors on a real server, with the deadlines moved to the server's clock.

    The sweep runs with a long restart grace on a fresh epoch: a lease shown dead under its
    process is judged at once; every other lease stamped by another process is deferred.
    """
    from rq_epoch.protocol import keys
    from tests.leases import start_job

    seconds, _ = conn.time()
    shift = float(seconds) - 10 - DEADLINE  # the vectors' deadline, 10 s ago by the server clock
    queue = Queue('seen', connection=conn)
    job, member = start_job(conn, queue, epoch=stamp)
    conn.zadd(keys.leases_key('seen'), {member: DEADLINE + shift}, xx=True)
    if record is not None:
        parsed = epoch.parse_seen_alive(record)
        if parsed is not None:
            record = f'{parsed.last + shift:.6f} {parsed.replid} {parsed.first + shift:.6f}'
        conn.hset(keys.alive_key(), OTHER, record)
    conn.delete(keys.primaries_key())  # this process's epoch begins now: inside the grace
    report = Sweeper(conn, max_stalled=3, restart_grace=3600).sweep(['seen'])
    assert [v.verdict for v in report.verdicts] == ['recovered' if counted else 'deferred']
    job.refresh()
    assert job.stalled == (1 if counted else 0)
    if counted:  # the stall is recorded under the process it happened under
        assert conn.hget(job.key, 'stall_epochs') == OTHER.encode()
