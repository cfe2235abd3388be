"""The epoch rule: the test vectors of docs/design.md, in Python and in the server's scripts."""

from __future__ import annotations

import pytest

from rq_epoch import Queue, Sweeper, epoch

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
