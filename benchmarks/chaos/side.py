"""One side of the chaos run: its server, workers, sweeper, producer and faults."""

from __future__ import annotations

import heapq
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from rq_epoch.embedded import EmbeddedServer
from rq_epoch.protocol import keys

from .audit import audit
from .plan import BUSY_WAIT, DEPLOY_BOUND, ROOT, SERVER_ERRORS, Config, FaultSpec, Plan
from .processes import Recorder, Supervisor, epoch_environment
from .producer import Producer
from .results import SideResult


class SideRun:
    """One side of the chaos run: its server, workers, sweeper, producer and faults."""

    def __init__(self, side: str, cfg: Config, plan: Plan, folder: Path, reaper: bool) -> None:
        """One side of ``plan``; its files (data, ledger, logs, events) go to ``folder``."""
        self.side = side
        self.cfg = cfg
        self.plan = plan
        self.folder = folder
        self.reaper = reaper
        folder.mkdir(parents=True, exist_ok=True)
        self.ledger = folder / 'ledger.log'
        (folder / 'data').mkdir(exist_ok=True)  # EmbeddedServer expects the folder to exist
        self.server = EmbeddedServer(cfg.server, data_dir=folder / 'data', appendfsync='always')
        self.topology: Any = None
        if cfg.topology == 'sentinel':
            from tests.sentinel import SentinelTopology

            guard = {'min-replicas-to-write': str(cfg.min_replicas), 'min-replicas-max-lag': '10'}
            self.topology = SentinelTopology(
                folder / 'topology',
                cfg.server,
                down_after_ms=1000,
                replicas=cfg.replicas,
                appendfsync='always',
                primary_config=guard if cfg.min_replicas else None,
                replica_config=guard if cfg.min_replicas else None,
            )
            self.server = self.topology.primary
        self.topology_busy_until = 0.0
        self.failover_attempts: Counter[int] = Counter()
        self.server_up = False
        self.recorder = Recorder(folder / 'events.jsonl', time.time())
        self.supervisor: Supervisor | None = None
        self.sweeper: subprocess.Popen[bytes] | None = None
        self.producer: Producer | None = None
        self.t0 = time.time()
        #: Rolling deploys begun so far (each stops every worker slot in turn).
        self.deploys = 0
        #: Whether a rolling deploy is under way (the next one waits for it).
        self.deploying = False

    # -- running ---------------------------------------------------------------------

    def run(self) -> SideResult:
        """Start everything, inject the faults, drain, stop the processes, audit; always clean up."""
        started = time.monotonic()
        try:
            if self.topology is not None:
                self.topology.start()
                connection = ['-c', self.topology.settings_module(self.folder / 'settings', socket_timeout=5)]
                connection += ['-P', str(self.folder / 'settings')]
            else:
                self.server.start()
                connection = ['--url', self.server.url]
            self.server_up = True
            self.recorder.add('server-start', run_id=self.server.run_id(), pid=self.server.pid)
            self.supervisor = Supervisor(self.side, self.cfg, connection, self.folder, self.recorder, self.reaper)
            self.supervisor.managed.add(self.server.pid or 0)
            if self.topology is not None:
                self.supervisor.managed.update(self.topology.pids)
            self.supervisor.start_all()
            self.sweeper = self._start_sweeper()
            t0 = time.time()
            self.t0 = t0
            self.recorder.t0 = t0
            self.producer = Producer(self.side, self.cfg, self.plan, self.client, self.ledger, t0)
            self.producer.start()
            self._inject(t0)
            self._drain()
            wall = time.monotonic() - started
            self._stop_processes()
            return audit(self, wall)
        finally:
            self.close()

    def _start_sweeper(self) -> subprocess.Popen[bytes]:
        """Start the cron-like sweeper process of this side."""
        env = dict(os.environ)
        env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
        env.update(epoch_environment(self.cfg))
        if self.topology is not None:
            where = ['--sentinel', ','.join(f'{h}:{p}' for h, p in self.topology.instances)]
        else:
            where = ['--url', self.server.url]
        argv = [
            sys.executable,
            '-m',
            'benchmarks.chaos',
            'sweeper',
            *where,
            '--side',
            self.side,
            '--interval',
            str(self.cfg.sweep_interval),
            *[arg for name in self.cfg.queue_names for arg in ('--queue', name)],
            '--out',
            str(self.folder / 'sweeper.jsonl'),
            '--limit',
            str(int(self.cfg.duration + self.cfg.freeze_seconds + 3 * self.cfg.drain_seconds(self.side) + 600)),
        ]
        with open(self.folder / 'sweeper.log', 'wb') as fh:
            proc = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        assert self.supervisor is not None
        self.supervisor.managed.add(proc.pid)
        return proc

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client to the primary: the server, or under Sentinel whichever the sentinels name."""
        options = {'socket_timeout': 5, 'socket_connect_timeout': 1, **kwargs}
        if self.topology is None:
            return self.server.client(**options)
        from tests.sentinel import MASTER_NAME

        return self.topology.sentinel().master_for(MASTER_NAME, **options)

    def _topology_fault(self, fault: FaultSpec) -> tuple[float, str, Any] | None:
        """A failover or a frozen primary, once the topology has settled from the last one."""
        topology = self.topology
        if topology is None:
            raise ValueError(f'{fault.kind} needs --topology sentinel')
        key = id(fault)
        if time.time() < self.topology_busy_until or not topology.ready():
            self.failover_attempts[key] += 1
            if self.failover_attempts[key] > 120:
                self.recorder.add('fault-skipped', fault=fault.kind, planned=fault.at, why='topology never settled')
                return None
            return (time.time() + 0.5, 'fault', fault)
        old = topology.current_primary()
        old_run_id = old.run_id()
        if fault.kind == 'failover':
            self.recorder.add('failover', planned=fault.at, run_id=old_run_id, port=old.port)
            assert self.producer is not None
            self.producer.calm.clear()
            try:
                old, new = topology.failover(timeout=30)
            except (redis.exceptions.ResponseError, TimeoutError) as exc:  # e.g. NOGOODSLAVE: try again soon
                self.recorder.add('failover-refused', error=str(exc))
                self.failover_attempts[key] += 1
                return (time.time() + 1.0, 'fault', fault) if self.failover_attempts[key] <= 20 else None
            finally:
                self.producer.calm.set()
            self.recorder.add('promoted', run_id=new.run_id(), port=new.port, old_port=old.port)
            self.topology_busy_until = time.time() + 2.0
            return None
        frozen_at = time.time()
        self.recorder.add('primary-freeze', planned=fault.at, run_id=old_run_id, port=old.port, pid=old.pid)
        old, new = topology.freeze_until_promoted(timeout=60)
        self.recorder.add('promoted', run_id=new.run_id(), port=new.port, old_port=old.port)
        self.topology_busy_until = float('inf')
        return (max(time.time(), frozen_at + fault.hold), 'primary-thaw', old)

    def _inject(self, t0: float) -> None:
        """Run the fault schedule; supervise the workers meanwhile."""
        assert self.supervisor is not None and self.producer is not None
        events: list[tuple[float, int, str, Any]] = []
        for i, fault in enumerate(self.plan.faults):
            heapq.heappush(events, (t0 + fault.at, i, 'fault', fault))
        seq = len(events)
        bound = t0 + self.cfg.duration + self.cfg.freeze_seconds + 3 * self.cfg.down_max + 120
        bound += self.cfg.deploys * self.cfg.workers * (self.cfg.shutdown_timeout + 15)
        while (events or self.producer.is_alive()) and time.time() < bound:
            self.supervisor.tick()
            while events and events[0][0] <= time.time():
                _, _, what, payload = heapq.heappop(events)
                follow = self._apply(what, payload)
                if follow is not None:
                    seq += 1
                    heapq.heappush(events, (follow[0], seq, follow[1], follow[2]))
            time.sleep(0.05)
        if events:
            self.recorder.add('schedule-unfinished', left=len(events))
        self.producer.stop.set()
        self.producer.join(10)

    def _apply(self, what: str, payload: Any) -> tuple[float, str, Any] | None:
        """Apply one event; return a follow-up event (time, kind, payload) if any."""
        assert self.supervisor is not None
        if what == 'fault':
            fault: FaultSpec = payload
            if fault.kind in ('failover', 'primary-freeze'):
                return self._topology_fault(fault)
            if fault.kind == 'deploy':
                if self.deploying:
                    return (time.time() + 0.5, 'fault', fault)  # one rolling deploy at a time
                self.deploying = True
                self.deploys += 1
                self.recorder.add('deploy-start', deploy=self.deploys, planned=fault.at)
                return (time.time(), 'deploy-step', DeployStep(fault, self.deploys, 0))
            if fault.kind in ('restart', 'crash'):
                if not self.server_up:
                    return (time.time() + 0.5, 'fault', fault)  # never two outages at once
                before = _run_id(self.server)
                self.recorder.add('server-down', crash=fault.kind == 'crash', run_id=before, planned=fault.at)
                if fault.kind == 'crash':
                    self.server.kill(signal.SIGKILL)
                else:
                    self.server.stop()  # SHUTDOWN: the AOF is written
                self.server_up = False
                return (time.time() + fault.hold, 'server-up', fault)
            slot = self.supervisor.pick(fault.slot, busy=time.time() < self.t0 + fault.at + BUSY_WAIT)
            if slot is None:
                if time.time() < self.t0 + fault.at + BUSY_WAIT:
                    return (time.time() + 0.2, 'fault', fault)  # wait a little for a busy worker
                self.recorder.add('fault-skipped', fault=fault.kind, planned=fault.at)
                return None
            if fault.kind == 'kill':
                self.recorder.add('kill', planned=fault.at, **self.supervisor.kill(slot))
                return None
            info = self.supervisor.freeze(slot)
            self.recorder.add('freeze', planned=fault.at, hold=fault.hold, **info)
            return (time.time() + fault.hold, 'thaw', (slot, info['pid']))
        if what == 'server-up':
            # The server answers from some moment between its start and this event (the start
            # waits for its first answer, then its run_id is read): 'started' is when it began.
            started = round(time.time(), 3)
            self.server.start(timeout=60)
            self.supervisor.managed.add(self.server.pid or 0)
            self.server_up = True
            self.recorder.add('server-up', run_id=_run_id(self.server), pid=self.server.pid, started=started)
            return None
        if what == 'thaw':
            slot, pid = payload
            self.recorder.add('thaw', slot=slot.index, pid=pid, resumed=self.supervisor.thaw(slot, pid))
            return None
        if what.startswith('deploy-'):
            return self._deploy(what, payload)
        if what == 'primary-thaw':
            self.topology.thaw(payload)
            self.recorder.add('primary-thaw', port=payload.port, pid=payload.pid)
            self.topology_busy_until = time.time() + 2.0
            return None
        raise ValueError(what)

    def _deploy(self, what: str, step: DeployStep) -> tuple[float, str, Any] | None:
        """One step of a rolling deploy: stop the slot's worker with its sequence (once it runs a job,
        or after :data:`BUSY_WAIT` seconds), follow up when its grace is over if it still runs, wait
        for its replacement, then go on with the next slot."""
        assert self.supervisor is not None
        slot = self.supervisor.slots[step.index]
        sequence, grace = step.fault.steps[step.index]
        if sequence == 'sigint-twice':
            grace = max(grace, 1.5)  # RQ ignores a second signal within a second of the first
        now = time.time()
        if what == 'deploy-step':
            step.tries += 1
            if not slot.alive or slot.frozen:
                if step.tries > 600:  # about two minutes without a running worker there
                    self.recorder.add('fault-skipped', fault='deploy', slot=slot.index, why='no worker to stop')
                    return self._next_slot(step)
                return (now + 0.2, 'deploy-step', step)
            if not self.supervisor.horses_of(slot) and step.tries * 0.2 < BUSY_WAIT:
                return (now + 0.2, 'deploy-step', step)  # a deploy that meets a running job
            info = self.supervisor.deploy_stop(slot, sequence)
            self.recorder.add('deploy-stop', deploy=step.number, grace=grace, **info)
            step.pid, step.stopped = info['pid'], now
            return (now + 0.1, 'deploy-wait', step)
        # deploy-wait: until the old worker is gone and its replacement runs.
        if slot.proc is not None and slot.proc.pid != step.pid and slot.alive:
            return self._next_slot(step)
        old_runs = slot.proc is not None and slot.proc.pid == step.pid and slot.proc.poll() is None
        if old_runs and not step.followed and now >= step.stopped + grace:
            step.followed = True
            killed = self.supervisor.deploy_follow_up(slot, step.pid, sequence, final=False)
            if killed:
                self.recorder.add('deploy-kill', deploy=step.number, slot=slot.index, pid=step.pid, killed=killed)
            elif sequence == 'sigint-twice':
                self.recorder.add('deploy-second-sigint', deploy=step.number, slot=slot.index, pid=step.pid)
        elif old_runs and now > step.stopped + grace + DEPLOY_BOUND:
            killed = self.supervisor.deploy_follow_up(slot, step.pid, sequence, final=True)
            if killed:
                self.recorder.add('deploy-kill', deploy=step.number, slot=slot.index, pid=step.pid, killed=killed)
        return (now + 0.1, 'deploy-wait', step)

    def _next_slot(self, step: DeployStep) -> tuple[float, str, Any] | None:
        """The deploy's next slot, or its end after the last one."""
        if step.index + 1 < len(step.fault.steps) and step.index + 1 < len(
            self.supervisor.slots if self.supervisor else []
        ):
            return (time.time(), 'deploy-step', DeployStep(step.fault, step.number, step.index + 1))
        self.recorder.add('deploy-done', deploy=step.number)
        self.deploying = False
        return None

    def _drain(self) -> None:
        """Wait, bounded, until every job has ended (or only dead-ends are left)."""
        assert self.supervisor is not None
        client = self.client()
        ids = [j.id for j in self.plan.jobs]
        parents = {j.id: j.parent for j in self.plan.jobs}
        deadline = time.monotonic() + self.cfg.drain_seconds(self.side)
        stuck_since: float | None = None
        try:
            while time.monotonic() < deadline:
                self.supervisor.tick()
                try:
                    with client.pipeline(transaction=False) as pipe:
                        for job_id in ids:
                            pipe.hget(keys.job_key(job_id), 'status')
                        statuses = {i: (s.decode() if s else '') for i, s in zip(ids, pipe.execute(), strict=True)}
                except SERVER_ERRORS:
                    time.sleep(0.5)
                    continue
                open_jobs = [i for i, s in statuses.items() if s not in ('finished', 'failed')]
                if not open_jobs:
                    self.recorder.add('drained')
                    return
                # A dependent still deferred after its parent ended will never move.
                dead_ends = all(
                    statuses[i] == 'deferred'
                    and parents[i]
                    and statuses.get(parents[i] or '') in ('finished', 'failed')
                    for i in open_jobs
                )
                if dead_ends:
                    stuck_since = stuck_since or time.monotonic()
                    if time.monotonic() - stuck_since > 10:
                        self.recorder.add('drain-dead-ends', jobs=open_jobs)
                        return
                else:
                    stuck_since = None
                time.sleep(0.5)
            self.recorder.add('drain-deadline')
        finally:
            client.close()

    def _stop_processes(self) -> None:
        """Stop the producer, the sweeper and every worker (bounded waits)."""
        if self.producer is not None:
            self.producer.stop.set()
        if self.sweeper is not None and self.sweeper.poll() is None:
            self.sweeper.send_signal(signal.SIGTERM)
            try:
                self.sweeper.wait(10)
            except subprocess.TimeoutExpired:
                self.sweeper.kill()
                self.sweeper.wait(5)
        if self.supervisor is not None:
            self.supervisor.stop_all()

    def close(self) -> None:
        """End every process of this side and stop the server (idempotent)."""
        try:
            self._stop_processes()
        finally:
            if self.topology is not None:
                self.topology.close()
            else:
                self.server.close()


class DeployStep:
    """Where a rolling deploy is: which deploy, which slot, the worker told to stop and when."""

    def __init__(self, fault: FaultSpec, number: int, index: int) -> None:
        """Slot ``index`` of deploy ``number`` (planned as ``fault``)."""
        self.fault = fault
        self.number = number
        self.index = index
        self.tries = 0
        self.pid = 0
        self.stopped = 0.0
        self.followed = False


def _run_id(server: EmbeddedServer) -> str:
    """The server's run_id, or "" while it is unreachable."""
    try:
        return server.run_id()
    except SERVER_ERRORS:
        return ''
