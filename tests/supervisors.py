"""The stop sequences of real supervisors, performed with real signals on a real worker's processes.

Each function does what one kind of supervisor does when it stops a worker (a deploy), to the
process tree of an ``rq worker`` subprocess (:class:`tests.conftest.WorkerProcess`): the worker,
its work-horse and whatever else descends from it, read from ``/proc`` (:mod:`rq_epoch.pids`).
The grace periods are the supervisors' own knob, in seconds; the tests choose them shorter or
longer than the worker's shutdown timeout.

=====================================  ================================================================
function                               who stops a worker this way
=====================================  ================================================================
:func:`term_worker_then_kill_all`      Kubernetes, ECS, ``docker stop``, Cloud Run: SIGTERM to the
                                       main process, SIGKILL to every process after the grace
:func:`term_all_then_kill_all`         systemd's default ``KillMode=control-group``, Heroku,
                                       supervisor's ``stopasgroup``: SIGTERM to every process at
                                       once, SIGKILL to every process after the grace
:func:`term_worker_then_kill_worker`   systemd ``KillMode=mixed`` (SIGTERM to the main process) and
                                       supervisor without ``stopasgroup``: SIGTERM to the main
                                       process only, SIGKILL to it after the grace
:func:`interrupt_group_twice`          Ctrl-C twice in a terminal: SIGINT to the foreground
                                       process group, twice
:func:`kill_all`                       no stop at all: the machine or container is lost
=====================================  ================================================================

Every function returns once the worker process has exited (its exit status is the caller's to
check); a process already gone is skipped (a PID is signalled only while it is the process
that was seen, :func:`rq_epoch.pids.send_signal`).
"""

from __future__ import annotations

import os
import signal
import subprocess

from rq_epoch.pids import descendants_of, proc_stat, send_signal
from tests.conftest import WorkerProcess

__all__ = [
    'interrupt_group_twice',
    'kill_all',
    'process_tree',
    'term_all_then_kill_all',
    'term_worker_then_kill_all',
    'term_worker_then_kill_worker',
]


def process_tree(root: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of ``root`` and of every process descending from it, root first."""
    tree = []
    for pid in [root, *descendants_of(root)]:
        stat = proc_stat(pid)
        if stat is not None:
            tree.append((pid, stat[1]))
    return tree


def _signal_all(tree: list[tuple[int, int]], sig: int) -> None:
    for pid, started in tree:
        send_signal(pid, sig, started)


def _wait_for_exit(worker: WorkerProcess, seconds: float) -> bool:
    """Wait up to ``seconds`` for the worker process to exit; True when it did."""
    try:
        worker.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _grace_then_kill(worker: WorkerProcess, tree: list[tuple[int, int]], grace: float) -> None:
    """After ``grace`` seconds (or as soon as the worker exits, whichever comes first), SIGKILL
    every process of ``tree`` still there, as the supervisor's timer would. A supervisor kills
    what is left of the group even when its main process exited: so does this."""
    _wait_for_exit(worker, grace)
    _signal_all(tree, signal.SIGKILL)
    worker.proc.wait(30)


def term_worker_then_kill_all(worker: WorkerProcess, grace: float) -> None:
    """Kubernetes, ECS, ``docker stop``: SIGTERM to the worker, SIGKILL to every process after ``grace``.

    The process tree is read when the stop begins: what the container holds then is what its
    SIGKILL reaches.
    """
    tree = process_tree(worker.pid)
    send_signal(worker.pid, signal.SIGTERM, tree[0][1])
    _grace_then_kill(worker, tree, grace)


def term_all_then_kill_all(worker: WorkerProcess, grace: float) -> None:
    """systemd's default (control group), Heroku: SIGTERM to every process at once, SIGKILL to all after ``grace``."""
    tree = process_tree(worker.pid)
    _signal_all(tree, signal.SIGTERM)
    _grace_then_kill(worker, tree, grace)


def term_worker_then_kill_worker(worker: WorkerProcess, grace: float) -> None:
    """systemd ``KillMode=mixed``'s first step, supervisor without ``stopasgroup``: SIGTERM to the
    worker only, and after ``grace`` SIGKILL to the worker only."""
    tree = process_tree(worker.pid)
    send_signal(worker.pid, signal.SIGTERM, tree[0][1])
    if not _wait_for_exit(worker, grace):
        send_signal(worker.pid, signal.SIGKILL, tree[0][1])
        worker.proc.wait(30)


def interrupt_group_twice(worker: WorkerProcess, gap: float, exit_within: float) -> None:
    """Ctrl-C twice in a terminal: SIGINT to the worker's process group, then again ``gap`` seconds later.

    The worker must lead a process group of its own (``start_worker(..., own_group=True)``),
    as a command started from a shell does; its work-horse leads one of its own (RQ's), so a
    terminal's SIGINT does not reach it. Waits ``exit_within`` seconds for the worker to exit
    after the second SIGINT, then SIGKILLs what is left of the tree (the test then fails on the
    exit status).
    """
    group = os.getpgid(worker.pid)
    assert group == worker.pid, 'the worker must lead its own process group'
    tree = process_tree(worker.pid)
    os.killpg(group, signal.SIGINT)
    if _wait_for_exit(worker, gap):
        return
    os.killpg(group, signal.SIGINT)
    _grace_then_kill(worker, tree, exit_within)


def kill_all(worker: WorkerProcess) -> None:
    """SIGKILL every process of the worker with no stop signal before (a lost machine)."""
    tree = process_tree(worker.pid)
    _signal_all(tree, signal.SIGKILL)
    worker.proc.wait(30)
