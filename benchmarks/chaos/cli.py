"""``python -m benchmarks.chaos``: both sides, one after the other, then the report."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .plan import EPOCH, FLAGS, SIDES, WORKER_CLASSES, Config, make_plan
from .processes import become_subreaper
from .report import describe, table, to_json
from .results import SideResult
from .side import SideRun
from .sweeper import sweeper_main


def run(cfg: Config, reaper: bool = False) -> list[SideResult]:
    """Run every side of ``cfg`` in turn on the same plan; return their audits."""
    plan = make_plan(cfg)
    base = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix='rq-epoch-chaos-'))
    own = cfg.workdir is None
    results: list[SideResult] = []
    try:
        for side in cfg.sides:
            print(f'--- {side}: running', flush=True)
            result = SideRun(side, cfg, plan, base / side.replace('-', '_'), reaper).run()
            print(f'--- {side}: done in {result.wall:.0f} s', flush=True)
            results.append(result)
    finally:
        if cfg.keep:
            print(f'kept {base}', flush=True)
        elif own:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for side in cfg.sides:
                shutil.rmtree(base / side.replace('-', '_'), ignore_errors=True)
    return results


def parse_args(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    """Command-line options -> :class:`Config`."""
    d = Config()
    p = argparse.ArgumentParser(prog='python -m benchmarks.chaos', description=__doc__.split('\n\n')[0])
    p.add_argument('--jobs', type=int, default=d.jobs, help='healthy jobs (J)')
    p.add_argument('--pills', type=int, default=d.pills, help='poison pills (P)')
    p.add_argument('--workers', type=int, default=d.workers, help='worker processes')
    p.add_argument(
        '--restarts', type=int, default=d.restarts, help='server restarts (K), SHUTDOWN and kill -9 alternately'
    )
    p.add_argument('--kills', type=int, default=d.kills, help='worker SIGKILLs (W)')
    p.add_argument('--freezes', type=int, default=d.freezes, help='worker freezes (F)')
    p.add_argument('--duration', type=float, default=d.duration, help='seconds over which jobs and faults are spread')
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--max-stalled', type=int, default=d.max_stalled)
    p.add_argument('--retries', type=int, default=None, help='Retry(max=N) on every job (default max-stalled - 1)')
    p.add_argument('--heartbeat', type=int, default=d.heartbeat, help='--job-monitoring-interval of both sides')
    p.add_argument('--lease-margin', type=int, default=d.lease_margin)
    p.add_argument('--sweep-interval', type=int, default=d.sweep_interval)
    p.add_argument('--restart-grace', type=int, default=d.restart_grace)
    p.add_argument('--min-seconds', type=float, default=d.min_seconds)
    p.add_argument('--max-seconds', type=float, default=d.max_seconds)
    p.add_argument('--callbacks', type=float, default=d.callbacks, help='share of healthy jobs with on_failure')
    p.add_argument(
        '--dependents', type=float, default=d.dependents, help='share of healthy jobs that depend on another'
    )
    p.add_argument('--down-min', type=float, default=d.down_min)
    p.add_argument('--down-max', type=float, default=d.down_max)
    p.add_argument('--freeze-for', type=float, default=None, help='seconds (default: longest lease + 2 sweeps + 3)')
    p.add_argument('--drain', type=float, default=None, help='seconds to wait for the last jobs (default per side)')
    p.add_argument('--server', choices=('valkey', 'redis'), default=d.server)
    p.add_argument('--sides', default=','.join(d.sides), help='stock,rq-epoch (either or both, in that order)')
    p.add_argument('--respawn-delay', type=float, default=d.respawn_delay)
    p.add_argument(
        '--queues', type=int, default=d.queues, help='queues every worker listens on; each job goes to one of them'
    )
    p.add_argument('--keep', action='store_true', help='keep the work folder (logs, ledger, events)')
    p.add_argument('--workdir', default=None, help='work folder (default: a new temp folder)')
    p.add_argument(
        '--topology',
        choices=('single', 'sentinel'),
        default=d.topology,
        help="one server, or a primary with replicas and three sentinels (workers use RQ's SENTINEL settings)",
    )
    p.add_argument('--replicas', type=int, default=d.replicas, help='replicas in the Sentinel topology')
    p.add_argument('--failovers', type=int, default=d.failovers, help='SENTINEL FAILOVERs (Sentinel topology)')
    p.add_argument(
        '--primary-freezes', type=int, default=d.primary_freezes, help='SIGSTOPs of the primary (Sentinel topology)'
    )
    p.add_argument(
        '--primary-freeze-for', type=float, default=d.primary_freeze_for, help='seconds a frozen primary stays stopped'
    )
    p.add_argument(
        '--min-replicas', type=int, default=d.min_replicas, help='min-replicas-to-write on every server (Sentinel)'
    )
    p.add_argument(
        '--worker-class',
        choices=WORKER_CLASSES,
        default=d.worker_class,
        help='rq_epoch.<class> on the rq-epoch side, rq.<class> on the stock side',
    )
    p.add_argument(
        '--deploys',
        type=int,
        default=d.deploys,
        help='rolling deploys: each stops every worker in turn (random stop sequence and grace)',
    )
    p.add_argument(
        '--shutdown-timeout',
        type=int,
        default=d.shutdown_timeout,
        help="RQ_EPOCH_SHUTDOWN_TIMEOUT of rq-epoch's workers (s)",
    )
    p.add_argument('--json', type=Path, default=None, help='write the results as JSON here')
    p.add_argument('--markdown', type=Path, default=None, help='write the tables (markdown) here')
    ns = p.parse_args(list(argv))
    sides = tuple(s.strip() for s in ns.sides.split(',') if s.strip())
    if not sides or any(s not in SIDES for s in sides):
        p.error(f'--sides takes {", ".join(SIDES)}')
    if ns.deploys < 0 or ns.shutdown_timeout < 0:
        p.error('--deploys and --shutdown-timeout cannot be negative')
    if ns.jobs < 1 or ns.workers < 1 or ns.max_stalled < 1 or ns.duration <= 0 or ns.queues < 1:
        p.error('--jobs, --workers, --max-stalled, --duration and --queues must be positive')
    if ns.topology == 'sentinel' and ns.restarts:
        p.error('--topology sentinel: use --failovers and --primary-freezes (and --restarts 0)')
    if ns.topology != 'sentinel' and (ns.failovers or ns.primary_freezes):
        p.error('--failovers and --primary-freezes need --topology sentinel')
    values = {name: getattr(ns, name) for name in FLAGS if name not in ('sides',)}
    cfg = Config(**{**values, 'sides': tuple(s for s in SIDES if s in sides)})
    return cfg, ns


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos comparison; exit 1 when an rq-epoch invariant fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == 'sweeper':
        return sweeper_main(args[1:])
    cfg, ns = parse_args(args)
    reaper = become_subreaper()

    def interrupted(signum: int, frame: Any) -> None:
        """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt, so the run cleans up."""
        raise KeyboardInterrupt(f'signal {signum}')

    signal.signal(signal.SIGINT, interrupted)  # also when started with SIGINT ignored (a background job)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    print(describe(cfg), flush=True)
    print(f'command: {cfg.command()}', flush=True)
    try:
        results = run(cfg, reaper=reaper)
    except KeyboardInterrupt:
        print('interrupted; every process and temp folder of the run was removed', file=sys.stderr)
        return 130
    text = table(results, cfg)
    print()
    print(text)
    status = 0
    for result in results:
        for note in result.notes:
            print(f'{result.side}: note: {note}')
        if result.violations:
            status = 1
            print(f'\n{result.side}: {len(result.violations)} INVARIANT VIOLATION(S)')
            for violation in result.violations:
                print(f'  {violation}')
            for job_id, history in result.histories.items():
                print(f'\n  history of {job_id}:')
                for line in history:
                    print(f'    {line}')
        elif result.side == EPOCH:
            print(f'\n{result.side}: every invariant holds')
    if ns.json:
        ns.json.write_text(json.dumps(to_json(results, cfg), indent=1))
    if ns.markdown:
        ns.markdown.write_text(text + '\n')
    return status
