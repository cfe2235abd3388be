"""The processes of one side: a supervisor keeping real ``rq worker`` processes alive, and the event log."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rq_epoch.pids import children_of, proc_stat, send_signal

from .plan import EPOCH, ROOT, Config


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), so none escapes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


class Recorder:
    """The run's event log (faults, worker exits, server restarts), with times."""

    def __init__(self, path: Path, t0: float) -> None:
        """Append events to ``path``; ``t0`` is the start of the run (for relative times)."""
        self.path = path
        self.t0 = t0
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, kind: str, **data: Any) -> dict[str, Any]:
        """Record one event, with its time, in memory and in the events file."""
        event = {'t': round(time.time(), 3), 'rel': round(time.time() - self.t0, 2), 'kind': kind, **data}
        with self._lock:
            self.events.append(event)
            with open(self.path, 'a', encoding='utf-8') as fh:
                fh.write(json.dumps(event) + '\n')
        return event


@dataclass
class Slot:
    """One worker slot of the supervisor."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    horses: dict[int, int] = field(default_factory=dict)
    frozen: list[tuple[int, int]] = field(default_factory=list)
    killed_by_harness: bool = False
    respawn_at: float = 0.0
    #: A deploy is stopping this slot's worker: no kill or freeze picks it meanwhile.
    deploying: bool = False

    @property
    def alive(self) -> bool:
        """Whether the slot has a worker process that has not exited."""
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Keeps ``n`` real ``rq worker`` processes running; ends what exited workers leave."""

    def __init__(
        self, side: str, cfg: Config, connection: list[str], folder: Path, recorder: Recorder, reaper: bool
    ) -> None:
        """Slots for ``cfg.workers`` workers of ``side``; ``connection`` is their connection options
        (``--url URL``, or ``-c MODULE -P DIR`` for a settings module with RQ's ``SENTINEL`` dict);
        logs go to ``folder``."""
        self.side = side
        self.cfg = cfg
        self.connection = connection
        self.folder = folder
        self.recorder = recorder
        self.reaper = reaper
        self.slots = [Slot(i) for i in range(cfg.workers)]
        self.managed: set[int] = set()
        self.baseline = set(children_of('self'))
        self.stopping = False
        self.env = dict(os.environ)
        self.env['PYTHONPATH'] = str(ROOT) + os.pathsep + self.env.get('PYTHONPATH', '')
        self.env['PYTHONUNBUFFERED'] = '1'
        self.env.update(epoch_environment(cfg))

    def argv(self) -> list[str]:
        """The ``rq worker`` command line of this side."""
        argv = [sys.executable, '-m', 'rq.cli', 'worker', *self.connection]
        argv += ['--job-monitoring-interval', str(self.cfg.heartbeat)]
        if self.side == EPOCH:
            argv += ['--worker-class', f'rq_epoch.{self.cfg.worker_class}']
        else:
            argv += ['--maintenance-interval', str(self.cfg.sweep_interval)]
            if self.cfg.worker_class != 'Worker':
                argv += ['--worker-class', f'rq.{self.cfg.worker_class}']
        return argv + list(self.cfg.queue_names)

    def start(self, slot: Slot) -> None:
        """Start a new worker process in ``slot`` (its log: ``worker-<slot>-<generation>.log``)."""
        slot.generation += 1
        log = self.folder / f'worker-{slot.index}-{slot.generation}.log'
        with open(log, 'wb') as fh:
            slot.proc = subprocess.Popen(
                self.argv(),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=self.env,
                start_new_session=True,
            )
        self.managed.add(slot.proc.pid)
        slot.horses = {}
        slot.frozen = []
        slot.killed_by_harness = False
        slot.deploying = False
        self.recorder.add('worker-start', slot=slot.index, pid=slot.proc.pid, log=log.name)

    def start_all(self) -> None:
        """Start a worker in every slot."""
        for slot in self.slots:
            self.start(slot)

    def horses_of(self, slot: Slot) -> dict[int, int]:
        """Current work-horses of a slot's worker, with their start times."""
        found: dict[int, int] = {}
        if slot.alive:
            assert slot.proc is not None
            for pid in children_of(slot.proc.pid):
                stat = proc_stat(pid)
                if stat is not None and stat[0] != 'Z':
                    found[pid] = stat[1]
        return found

    def tick(self) -> None:
        """Notice exits, end leftovers, start replacements, reap orphans."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None:
                if not self.stopping and now >= slot.respawn_at:
                    self.start(slot)
                continue
            code = slot.proc.poll()
            if code is None:
                if not slot.frozen:
                    slot.horses.update(self.horses_of(slot))
                continue
            if slot.deploying:
                cause = 'deploy'
            elif slot.killed_by_harness:
                cause = 'harness kill'
            else:
                cause = 'signal' if code < 0 else 'exit'
            left = [pid for pid, started in slot.horses.items() if send_signal(pid, signal.SIGKILL, started)]
            self.recorder.add(
                'worker-exit', slot=slot.index, pid=slot.proc.pid, returncode=code, cause=cause, ended_leftovers=left
            )
            slot.proc = None
            slot.horses = {}
            slot.frozen = []
            slot.respawn_at = now + self.cfg.respawn_delay
        self.reap()

    def reap(self) -> None:
        """End and reap orphaned descendants handed to this process (as their subreaper)."""
        if not self.reaper:
            return
        for pid in children_of('self'):
            if pid in self.managed or pid in self.baseline:
                continue
            stat = proc_stat(pid)
            if stat is not None and stat[0] != 'Z':
                send_signal(pid, signal.SIGCONT)
                send_signal(pid, signal.SIGKILL)
                self.recorder.add('orphan-ended', pid=pid)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def pick(self, hint: int, busy: bool) -> Slot | None:
        """The first busy, unfrozen worker from slot ``hint`` on; without ``busy``, else a live one."""
        n = len(self.slots)
        order = [self.slots[(hint + i) % n] for i in range(n)]
        for slot in order:
            if slot.alive and not slot.frozen and not slot.deploying and self.horses_of(slot):
                return slot
        if busy:
            return None
        for slot in order:
            if slot.alive and not slot.frozen and not slot.deploying:
                return slot
        return None

    def kill(self, slot: Slot) -> dict[str, Any]:
        """SIGKILL a worker and its work-horse (a machine or container lost)."""
        assert slot.proc is not None
        horses = self.horses_of(slot)
        slot.killed_by_harness = True
        send_signal(slot.proc.pid, signal.SIGKILL)
        for pid, started in horses.items():
            send_signal(pid, signal.SIGKILL, started)
        return {'slot': slot.index, 'pid': slot.proc.pid, 'horses': sorted(horses)}

    def freeze(self, slot: Slot) -> dict[str, Any]:
        """SIGSTOP a worker and its work-horse (a frozen VM or container)."""
        assert slot.proc is not None
        horses = self.horses_of(slot)
        started = proc_stat(slot.proc.pid)
        slot.frozen = [(slot.proc.pid, started[1] if started else 0)] + list(horses.items())
        for pid, start in slot.frozen:
            send_signal(pid, signal.SIGSTOP, start)
        return {'slot': slot.index, 'pid': slot.proc.pid, 'horses': sorted(horses)}

    def deploy_stop(self, slot: Slot, sequence: str) -> dict[str, Any]:
        """The first signal of a deploy's stop ``sequence`` (see ``plan.STOP_SEQUENCES``): SIGTERM to
        the worker (and, for ``systemd``, to its work-horse too), or SIGINT for ``sigint-twice``."""
        assert slot.proc is not None
        horses = self.horses_of(slot)
        slot.deploying = True
        first = signal.SIGINT if sequence == 'sigint-twice' else signal.SIGTERM
        send_signal(slot.proc.pid, first)
        if sequence == 'systemd':
            for pid, started in horses.items():
                send_signal(pid, signal.SIGTERM, started)
        return {'slot': slot.index, 'pid': slot.proc.pid, 'horses': sorted(horses), 'sequence': sequence}

    def deploy_follow_up(self, slot: Slot, pid: int, sequence: str, final: bool) -> list[int]:
        """What a deploy does when the grace is over, if the worker ``pid`` still runs: SIGKILL to it and
        its work-horses (``k8s``, ``systemd``, or any sequence once ``final``), or the second SIGINT."""
        if slot.proc is None or slot.proc.pid != pid or slot.proc.poll() is not None:
            return []
        if sequence == 'sigint-twice' and not final:
            send_signal(pid, signal.SIGINT)
            return []
        if sequence == 'term-only' and not final:
            return []
        horses = {**slot.horses, **self.horses_of(slot)}
        send_signal(pid, signal.SIGKILL)
        return [pid] + [h for h, started in horses.items() if send_signal(h, signal.SIGKILL, started)]

    def thaw(self, slot: Slot, pid: int) -> bool:
        """SIGCONT what :meth:`freeze` stopped, if that worker is still the slot's."""
        if slot.proc is None or slot.proc.pid != pid or not slot.frozen:
            return False
        for p, start in slot.frozen:
            send_signal(p, signal.SIGCONT, start)
        slot.frozen = []
        return True

    def stop_all(self) -> None:
        """End every worker and work-horse of this run (bounded waits)."""
        self.stopping = True
        for slot in self.slots:
            for pid, start in slot.frozen:
                send_signal(pid, signal.SIGCONT, start)
            if slot.proc is not None and slot.proc.poll() is None:
                horses = self.horses_of(slot)
                send_signal(slot.proc.pid, signal.SIGKILL)
                for pid, start in {**slot.horses, **horses}.items():
                    send_signal(pid, signal.SIGKILL, start)
                try:
                    slot.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self.reap()


def epoch_environment(cfg: Config) -> dict[str, str]:
    """The ``RQ_EPOCH_*`` settings given to rq-epoch's workers and sweeper."""
    return {
        'RQ_EPOCH_MAX_STALLED': str(cfg.max_stalled),
        'RQ_EPOCH_HEARTBEAT_INTERVAL': str(cfg.heartbeat),
        'RQ_EPOCH_LEASE_MARGIN': str(cfg.lease_margin),
        'RQ_EPOCH_SWEEP_INTERVAL': str(cfg.sweep_interval),
        'RQ_EPOCH_RESTART_GRACE': str(cfg.restart_grace),
        'RQ_EPOCH_SHUTDOWN_TIMEOUT': str(cfg.shutdown_timeout),
    }
