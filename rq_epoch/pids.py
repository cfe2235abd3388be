"""Finding and signalling processes by PID, for the demo, the tests and the benchmarks.

Child processes (an ``rq worker``'s work-horse) and a process's state are read from
``/proc`` where there is one (Linux); a signal goes only to a process that is still alive
and, when its start time is given, still the process that was seen (a PID can be reused).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ['HAS_PROC', 'carries', 'children_of', 'descendants_of', 'is_alive', 'marked', 'proc_stat', 'send_signal']

#: Whether this system has a ``/proc`` to read processes from.
HAS_PROC = Path('/proc/self/stat').exists()


def children_of(pid: int | str) -> list[int]:
    """Child PIDs of a process (the children of every one of its threads); ``'self'`` for this one."""
    found: list[int] = []
    try:
        tasks = list(Path(f'/proc/{pid}/task').iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(x) for x in (task / 'children').read_text().split()]
        except OSError:
            continue
    return found


def descendants_of(pid: int) -> list[int]:
    """Every descendant of a process (children first, then theirs), as far as ``/proc`` tells."""
    found: list[int] = []
    for child in children_of(pid):
        found.append(child)
        found.extend(descendants_of(child))
    return found


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, or None when it is gone."""
    try:
        text = Path(f'/proc/{pid}/stat').read_text()
    except OSError:
        return None
    try:
        fields = text[text.rindex(')') + 2 :].split()
        return fields[0], int(fields[19])
    except (ValueError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    if HAS_PROC:
        stat = proc_stat(pid)
        return stat is not None and stat[0] != 'Z'
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def carries(pid: int, name: str, value: str) -> bool:
    """True while ``pid`` is alive and its environment has ``name=value`` (read from ``/proc``)."""
    if not is_alive(pid):
        return False
    try:
        environ = Path(f'/proc/{pid}/environ').read_bytes()
    except OSError:
        return False
    return f'{name}={value}'.encode() in environ.split(b'\0')


def marked(name: str, value: str) -> list[int]:
    """PIDs of every live process whose environment has ``name=value`` (empty without ``/proc``)."""
    if not HAS_PROC:
        return []
    pids = [int(entry.name) for entry in Path('/proc').iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if carries(pid, name, value)]


def send_signal(pid: int, sig: int, started: int | None = None) -> bool:
    """Send ``sig`` to ``pid`` if it is alive and (when ``started`` is given) has that start time.

    Returns True when the signal was sent.
    """
    if HAS_PROC:
        stat = proc_stat(pid)
        if stat is None or stat[0] == 'Z' or (started is not None and stat[1] != started):
            return False
    try:
        os.kill(pid, sig)
    except OSError:
        return False
    return True
