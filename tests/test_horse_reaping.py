"""The worker never loses how its work-horse exited to RQ's monitor alarm.

RQ's monitor waits for the work-horse in ``wait4`` under a SIGALRM whose handler raises. When
that alarm lands just after ``wait4`` reaped the work-horse, stock RQ's next wait finds no
child ("waitpid returned None") and fails the job as if its work-horse had died, even when the
work-horse had handed it back to its queue (a HerokuWorker warned of a shutdown). The window is
opened here deterministically: a real SIGALRM, under RQ's own death penalty, is raised right
after the real ``wait4`` returned, with real child processes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rq.timeouts import HorseMonitorTimeoutException, UnixSignalDeathPenalty
from rq.worker import Worker as RQWorker

from rq_epoch import Worker
from rq_epoch.adapters import rq as rq_adapter
from rq_epoch.worker.reaping import HorseReaper, wait_status


def child(ending: Callable[[], None]) -> int:
    """A real child process that ends by ``ending`` at once."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            ending()
        finally:
            os._exit(70)
    return pid


def exit_with(code: int) -> Callable[[], None]:
    return lambda: os._exit(code)


def killed_by(signum: int) -> Callable[[], None]:
    return lambda: os.kill(os.getpid(), signum)


@pytest.fixture
def alarm_after_wait4(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Make the next ``os.wait4`` deliver a real SIGALRM to this process right after it returns.

    Yields the list of pids that ``wait4`` reaped with the alarm following.
    """
    real_wait4 = os.wait4
    reaped: list[int] = []

    def wait4_then_alarm(pid: int, options: int) -> Any:
        result = real_wait4(pid, options)
        if not reaped:
            reaped.append(result[0])
            signal.raise_signal(signal.SIGALRM)  # RQ's handler raises HorseMonitorTimeoutException
        return result

    monkeypatch.setattr(os, 'wait4', wait4_then_alarm)
    yield reaped


def wait_under_monitor_alarm(wait: Callable[[], Any]) -> Any:
    """One wait of RQ's monitor: ``wait`` inside RQ's death penalty of one interval."""
    with UnixSignalDeathPenalty(30, HorseMonitorTimeoutException):
        return wait()


@pytest.mark.parametrize(
    ('ending', 'exited_normally'),
    [(exit_with(0), True), (exit_with(3), False), (killed_by(signal.SIGKILL), False)],
    ids=['exit-0', 'exit-3', 'sigkill'],
)
def test_the_noted_status_is_the_status_wait4_reports(ending: Callable[[], None], exited_normally: bool) -> None:
    pid = child(ending)
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None
    reaped, status, _ = os.wait4(pid, 0)
    assert reaped == pid
    assert wait_status(info) == status
    assert (os.waitstatus_to_exitcode(status) == 0) is exited_normally


def test_stock_rq_loses_the_exit_when_the_alarm_lands_after_the_reap(conn, alarm_after_wait4: list[int]) -> None:
    """The window this guards against, shown on RQ's own worker: its next wait finds no child."""
    worker = RQWorker(['default'], connection=conn)
    pid = child(exit_with(0))
    rq_adapter.set_horse_pid(worker, pid)
    with pytest.raises(HorseMonitorTimeoutException):
        wait_under_monitor_alarm(worker.wait_for_horse)
    assert alarm_after_wait4 == [pid]
    assert wait_under_monitor_alarm(worker.wait_for_horse) == (None, None, None)


@pytest.mark.parametrize('code', [0, 3])
def test_the_worker_still_reports_the_exit_when_the_alarm_lands_after_the_reap(
    conn, alarm_after_wait4: list[int], code: int
) -> None:
    worker = Worker(['default'], connection=conn)
    pid = child(exit_with(code))
    rq_adapter.set_horse_pid(worker, pid)
    with pytest.raises(HorseMonitorTimeoutException):
        wait_under_monitor_alarm(worker.wait_for_horse)
    assert alarm_after_wait4 == [pid]  # the alarm came after the real reap
    reaped, status, _ = wait_under_monitor_alarm(worker.wait_for_horse)
    assert reaped == pid
    assert status is not None and os.waitstatus_to_exitcode(status) == code


def test_an_alarm_during_the_wait_loses_nothing() -> None:
    """The alarm that cuts the wait short before the work-horse exits: the next wait reaps it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child: exits 5 once the pipe is closed
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(5)
    os.close(read_end)
    reaper = HorseReaper()
    try:
        with pytest.raises(HorseMonitorTimeoutException):
            with UnixSignalDeathPenalty(1, HorseMonitorTimeoutException):
                reaper.wait(pid)  # the child is still running: the alarm ends this wait
    finally:
        os.close(write_end)  # the child exits now
    reaped, status, _ = wait_under_monitor_alarm(lambda: reaper.wait(pid))
    assert reaped == pid
    assert status is not None and os.waitstatus_to_exitcode(status) == 5


def test_a_pid_that_is_no_child_gives_what_rq_gives() -> None:
    assert HorseReaper().wait(os.getppid()) == (None, None, None)
