"""Chaos run: stock RQ and rq-epoch under the same seeded faults, audited against a ledger.

``python -m benchmarks.chaos [options]`` runs, for each side (``stock``: ``rq worker``;
``rq-epoch``: ``rq worker --worker-class rq_epoch.Worker``), on a fresh server of its own:

* a real server (Valkey or redis-server) with AOF and ``appendfsync always``;
* a pool of real ``rq worker`` subprocesses kept alive by a supervisor, as systemd or a
  container runtime would: a worker that exits is started again after ``--respawn-delay``
  seconds, and whatever an exited worker left running (its work-horse) is ended, as a
  control-group kill or a container exit does; with ``--queues N`` every worker listens
  on N queues (``chaos``, ``chaos-2``, ...) and each job goes to one of them;
* a cron-like sweeper process (``python -m benchmarks.chaos sweeper``): rq-epoch's
  :class:`rq_epoch.Sweeper` on one side, stock ``StartedJobRegistry.cleanup()`` on the
  other, every ``--sweep-interval`` seconds; the workers' own maintenance runs as well
  (rq-epoch's sweep interval; stock ``--maintenance-interval`` set to the same value);
* a producer that enqueues the workload at its planned times: healthy jobs of mixed
  length, poison pills (each attempt SIGKILLs its worker and work-horse), ``on_failure``
  callbacks and ``allow_failure`` dependents;
* the fault schedule: server restarts (clean SHUTDOWN and ``kill -9``), SIGKILLs of a
  busy worker and its horse, and freezes (SIGSTOP of a busy worker and its horse for
  longer than the lease, then SIGCONT).

Workload and schedule come from ``--seed`` alone, so both sides get the same ones. Then
every job is audited against the ledger the jobs write outside Redis
(:mod:`benchmarks.chaos_jobs`), one table row per side, and rq-epoch's invariants are
checked; a violation prints the job's history and the exit status is 1.

Both sides use the same heartbeat (``--job-monitoring-interval``). Stock RQ adds 60 s to
every lease (its heartbeat TTL is the interval plus 60) and only notices a stall when its
cleanup runs after that; rq-epoch's lease is the heartbeat plus ``--lease-margin``.

Only loopback is used, only processes this run started are signalled, every wait is
bounded, and all processes and temp folders are removed at the end, also on Ctrl-C.

The package follows the run: :mod:`.plan` (configuration, seeded workload and faults),
:mod:`.processes` (the supervisor of the workers, the event log), :mod:`.producer`,
:mod:`.side` (one side: server, workers, sweeper, faults, drain), :mod:`.audit` (the ledger
against the server, the invariants), :mod:`.results`, :mod:`.report`, :mod:`.cli` (both sides,
the command line) and :mod:`.sweeper` (the cron-like sweeper process).
"""

from __future__ import annotations

from .audit import check_invariants, explain, in_order_of_start
from .cli import main, run
from .plan import Config, make_plan
from .results import Attempt, JobAudit, SideResult

__all__ = [
    'Attempt',
    'Config',
    'JobAudit',
    'SideResult',
    'check_invariants',
    'explain',
    'in_order_of_start',
    'main',
    'make_plan',
    'run',
]
