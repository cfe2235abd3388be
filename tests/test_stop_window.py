"""The stop window, in Python: the rule the sweep script applies to a lease marked stopping, and
the settings it comes from. The same rule on a real server: ``tests/test_stopping.py``."""

from __future__ import annotations

import pytest

from rq_epoch.errors import ConfigurationError
from rq_epoch.protocol.epoch import StopMark, parse_stop_mark, within_stop_window
from rq_epoch.settings import UNLIMITED_STOP_WAIT, EpochSettings
from rq_epoch.worker.stopping import StopRequest

MARK = StopMark(execution_id='e1', marked_at=1000.0, until=1035.0)


@pytest.mark.parametrize(
    ('execution_id', 'deadline', 'mark', 'within'),
    [
        ('e1', 1000.0, MARK, True),  # ran out at the mark
        ('e1', 1020.5, MARK, True),  # within the window
        ('e1', 1035.0, MARK, True),  # at the window's end
        ('e1', 1035.01, MARK, False),  # after the window: judged as any other lease
        ('e1', 999.99, MARK, False),  # ran out before its worker was told to stop
        ('e2', 1020.0, MARK, False),  # marked by an earlier execution of the job
        ('e1', 1020.0, None, False),  # never marked
        ('e1', None, MARK, False),  # no deadline read
        ('', 1020.0, MARK, False),
    ],
)
def test_a_lease_is_stopping_only_when_marked_by_its_execution_and_run_out_within_the_window(
    execution_id: str, deadline: float | None, mark: StopMark | None, within: bool
) -> None:
    assert within_stop_window(execution_id, deadline, mark) is within


@pytest.mark.parametrize(
    ('raw', 'parsed'),
    [
        (b'e1 1000.000000 1035.000000', MARK),
        ('e1 1000 1035', MARK),
        (None, None),
        ('', None),
        ('e1 1000', None),
        ('e1 x 1035', None),
        (' 1000 1035', None),
    ],
)
def test_the_mark_is_read_from_its_field(raw: str | bytes | None, parsed: StopMark | None) -> None:
    assert parse_stop_mark(raw) == parsed


def test_the_window_is_the_shutdown_timeout_plus_one_lease() -> None:
    settings = EpochSettings.resolve(environ={}, heartbeat_interval=10, lease_margin=20, shutdown_timeout=20)
    assert settings.stop_window == 20 + 30
    assert EpochSettings.resolve(environ={}, shutdown_timeout=0).stop_window == 30
    unlimited = EpochSettings.resolve(environ={'RQ_EPOCH_SHUTDOWN_TIMEOUT': 'unlimited'})
    assert unlimited.shutdown_timeout is None
    assert unlimited.stop_window == UNLIMITED_STOP_WAIT + 30


def test_the_shutdown_timeout_default_is_under_the_usual_30_second_grace() -> None:
    assert EpochSettings.resolve(environ={}).shutdown_timeout == 20


@pytest.mark.parametrize('value', ['-1', 'soon', '1.5', True])
def test_a_shutdown_timeout_that_is_not_whole_seconds_or_unlimited_is_refused(value: object) -> None:
    with pytest.raises(ConfigurationError, match='shutdown'):
        EpochSettings.resolve(environ={}, shutdown_timeout=value)


def test_a_stop_request_is_due_after_its_timeout_or_at_once_when_cold() -> None:
    stop = StopRequest(asked_at=100.0, timeout=20)
    assert not stop.due(now=119.9)
    assert stop.due(now=120.0)
    assert stop.seconds_left(now=110.0) == pytest.approx(10.0)
    unlimited = StopRequest(asked_at=100.0, timeout=None)
    assert not unlimited.due(now=10**9)
    assert unlimited.seconds_left(now=10**9) is None
    unlimited.cold = True
    assert unlimited.due(now=100.0)
