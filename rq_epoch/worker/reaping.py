"""Reaping the work-horse without losing how it exited.

RQ's monitor waits for the work-horse in ``os.wait4`` under an alarm of one monitoring
interval (its death penalty), whose handler raises ``HorseMonitorTimeoutException``. An alarm
that lands just after ``wait4`` reaped the work-horse, before the result reached RQ's monitor,
loses the exit status: RQ's next wait finds no child ("waitpid returned None") and RQ takes the
job for one whose work-horse died, and fails it. A job its work-horse had ended another way
(handed back to its queue by a HerokuWorker's work-horse, or requeued for a retry) would get a
second outcome; the fence refuses it, but it would be counted and logged as a stale outcome.

:class:`HorseReaper` waits for the exit first *without* reaping the work-horse (``waitid`` with
``WNOWAIT``: an alarm that cuts that wait short loses nothing, the work-horse stays a zombie),
notes its status, and only then reaps it. A wait cut short after the reap is answered from the
note.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ['HorseReaper', 'WaitResult', 'wait_status']

#: What RQ's ``wait_for_horse`` returns: the pid reaped, its wait status, its resource usage.
WaitResult = tuple[int | None, int | None, Any]


def wait_status(info: os.waitid_result) -> int:
    """The wait status, as ``os.wait4`` reports it, of the exit that ``os.waitid`` reported."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8  # os.WIFEXITED, os.WEXITSTATUS
    core_dumped = 0x80 if info.si_code == os.CLD_DUMPED else 0
    return info.si_status | core_dumped  # os.WIFSIGNALED, os.WTERMSIG


class HorseReaper:
    """Waits for a work-horse to exit and reaps it; an alarm that interrupts never loses its status."""

    def __init__(self) -> None:
        #: The exit noted before the reap: (pid, wait status).
        self._noted: tuple[int, int] | None = None

    def wait(self, pid: int) -> WaitResult:
        """Wait until the child ``pid`` exits and reap it: ``(pid, wait status, rusage)``.

        Returns ``(None, None, None)`` when ``pid`` is no child of this process, as RQ's
        ``wait_for_horse`` does. An exception raised by a signal handler meanwhile (RQ's
        monitor alarm) propagates; the next call for the same ``pid`` still reports its exit
        (without its resource usage when the earlier call had reaped it already).
        """
        if self._noted is None or self._noted[0] != pid:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                return None, None, None
            if info is None:  # only with WNOHANG, which is not asked for; typed so by the standard library
                return None, None, None
            self._noted = (pid, wait_status(info))
        noted_status = self._noted[1]
        try:
            reaped, status, rusage = os.wait4(pid, 0)  # the work-horse has exited: this does not block
        except ChildProcessError:  # reaped by an earlier call that an alarm cut short
            return pid, noted_status, None
        return reaped, status, rusage
