"""The report: the table per side, the description of the run and its JSON form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

import rq

from .plan import EPOCH, STOCK, Config, make_plan
from .results import SideResult


def _n(count: int, noun: str) -> str:
    """``1 kill``, ``2 kills``."""
    return f'{count} {noun}' + ('' if count == 1 else 's')


def _seconds(value: float) -> str:
    """Seconds for the table: "12 s", "3.4 s"."""
    return f'{value:.0f} s' if value >= 10 else f'{value:.1f} s'


def table(results: Sequence[SideResult], cfg: Config) -> str:
    """The audit table (markdown), one row per side, and a second one with the details."""
    head = (
        '| side | jobs finished | healthy jobs failed or dead-lettered | poison pills dead-lettered | lost | stuck '
        '| executions per job | retries spent | wall time |'
    )
    lines = [head, '|' + '---|' * 9]
    for result in results:
        r = result.row()
        why = ', '.join(f'{v} {k}' for k, v in sorted(r['healthy_failed_why'].items(), key=lambda kv: -kv[1]))
        failed = f'{r["healthy_failed"]}' + (f' ({why})' if why else '')
        if result.side == EPOCH:
            stalls = sorted(set(r['pill_stalls']))
            pills = f'{r["pills_dead"]}/{r["pills"]} (after {"/".join(map(str, stalls)) or "-"} counted stalls)'
        else:
            runs = sorted(set(r['pill_executions']))
            noun = 'execution' if runs == [1] else 'executions'
            pills = f'{r["pills_dead"]}/{r["pills"]} (after {"/".join(map(str, runs)) or "-"} {noun}; no stall count)'
        reasons = ', '.join(f'{k} {v}' for k, v in sorted(r['superseded_executions'].items(), key=lambda kv: -kv[1]))
        executions = f'max {r["max_executions"]}; {r["ran_more_than_once"]} ran more than once'
        if reasons:
            executions += f' (runs cut short by: {reasons})'
        lines.append(
            f'| {result.side} | {r["healthy_finished"]}/{r["healthy"]} | {failed} | {pills} '
            f'| {r["lost"]} | {r["stuck"]} '
            f'| {executions} | {r["retries_spent"]} | {_seconds(r["wall_seconds"])} |'
        )
    lines += [
        '',
        '| side | faults applied | worker exits (not by the harness) | counted stalls of healthy jobs '
        '| uncounted recoveries | on_failure callbacks run | jobs with two outcomes recorded '
        '| stale outcomes landed (refused) |',
        '|' + '---|' * 8,
    ]
    for result in results:
        r = result.row()
        faults = (
            f'{_n(r["restarts"], "restart")} ({r["restarts"] - r["restarts_crash"]} SHUTDOWN, '
            f'{r["restarts_crash"]} kill -9), {_n(r["kills"], "kill")}, {_n(r["freezes"], "freeze")}'
        )
        if cfg.topology == 'sentinel':
            primaries = 'frozen primary' if r['primary_freezes'] == 1 else 'frozen primaries'
            faults = (
                f'{_n(r["failovers"], "failover")}, {r["primary_freezes"]} {primaries}, '
                f'{_n(r["kills"], "kill")}, {_n(r["freezes"], "freeze")}'
            )
        healthy_stalls = str(r['counted_stalls_healthy']) if result.side == EPOCH else 'n/a'
        recoveries = str(r['uncounted_recoveries']) if result.side == EPOCH else 'n/a'
        lines.append(
            f'| {result.side} | {faults} | {r["worker_exits_own"]} | {healthy_stalls} | {recoveries} '
            f'| {r["callbacks_run"]} | {r["jobs_with_two_outcomes"]} '
            f'| {r["stale_outcomes_landed"]} ({r["stale_outcomes_refused"] if result.side == EPOCH else "n/a"}) |'
        )
    lines += [
        '',
        '| side | deaths that should count (in the band) | counted (of them after a restart or failover) '
        '| uncounted | counted wrongly | deaths a restart or failover came first for '
        '| poison pills: executions (deaths that should count / in the band / restart first) |',
        '|' + '---|' * 7,
    ]
    for result in results:
        r = result.row()
        pills = ', '.join(
            f'{p["executions"]} ({p["should_count"]}/{p["band"]}/{p["restart_first"]})' for p in r['pill_deaths']
        )
        if result.side != EPOCH:
            lines.append(
                f'| {result.side} | {r["deaths_should_count"]} ({r["deaths_band"]}) | n/a | n/a | n/a '
                f'| {r["deaths_exempt"]} | {pills or "-"} |'
            )
            continue
        lines.append(
            f'| {result.side} | {r["deaths_should_count"]} ({r["deaths_band"]}) '
            f'| {r["deaths_counted"]} ({r["deaths_counted_later"]}) '
            f'| {r["deaths_uncounted"]} | {r["deaths_counted_wrongly"]} | {r["deaths_exempt"]} | {pills or "-"} |'
        )
    if cfg.deploys:
        lines += ['', *deploy_table(results)]
    return '\n'.join(lines)


def deploy_table(results: Sequence[SideResult]) -> list[str]:
    """The rolling deploys' table: what the stops did to the jobs they met, per side."""
    lines = [
        '| side | deploys (workers stopped: by sequence) | SIGKILLs after the grace | jobs handed back '
        '| requeued as stopping | stalls counted because of a deploy | healthy jobs failed (after a deploy) '
        '| poison pills dead-lettered (after counted stalls) |',
        '|' + '---|' * 8,
    ]
    for result in results:
        r = result.row()
        sequences = ', '.join(f'{k} {v}' for k, v in sorted(r['deploy_sequences'].items()))
        epoch = result.side == EPOCH
        stalls = sorted(set(r['pill_stalls']))
        pills = f'{r["pills_dead"]}/{r["pills"]}' + (f' (after {"/".join(map(str, stalls)) or "-"})' if epoch else '')
        lines.append(
            f'| {result.side} | {r["deploys"]} ({r["deploy_stops"]}: {sequences or "-"}) | {r["deploy_kills"]} '
            f'| {r["handed_back"] if epoch else "n/a"} | {r["stopping_verdicts"] if epoch else "n/a"} '
            f'| {r["deploy_stalls"] if epoch else "n/a"} | {r["healthy_failed"]} ({r["healthy_failed_after_deploy"]}) '
            f'| {pills} |'
        )
    return lines


def describe(cfg: Config) -> str:
    """One paragraph with the resolved parameters."""
    retry = f'Retry(max={cfg.retry_budget}) on every job' if cfg.retry_budget else 'no Retry'
    return (
        (
            f'J={cfg.jobs} healthy jobs ({cfg.min_seconds}-{cfg.max_seconds} s, {cfg.callbacks:.0%} with on_failure, '
            f'{cfg.dependents:.0%} dependents), P={cfg.pills} poison pills, {cfg.workers} workers, K={cfg.restarts} '
            f'restarts (down {cfg.down_min}-{cfg.down_max} s, alternately SHUTDOWN and kill -9, appendfsync always), '
            f'W={cfg.kills} worker kills, F={cfg.freezes} freezes of {cfg.freeze_seconds:.0f} s, '
            f'{cfg.queues} queue(s) per worker, '
            f'over {cfg.duration:.0f} s; '
            f'max_stalled {cfg.max_stalled}, {retry}, heartbeat {cfg.heartbeat} s, '
            f'leases {cfg.lease(EPOCH):.0f} s (rq-epoch) / {cfg.lease(STOCK):.0f} s (stock), sweeps every '
            f'{cfg.sweep_interval} s, restart grace {cfg.restart_grace} s; server {cfg.server}; seed {cfg.seed}; '
            f'RQ {rq.__version__}'
        )
        + (
            f'; Sentinel topology: a primary, {cfg.replicas} replica(s), 3 sentinels (down-after 1 s), '
            f'{cfg.failovers} failovers, {cfg.primary_freezes} frozen primaries ({cfg.primary_freeze_for:.0f} s), '
            f'min-replicas-to-write {cfg.min_replicas}'
            if cfg.topology == 'sentinel'
            else ''
        )
        + (
            f'; {cfg.deploys} rolling deploys (every worker stopped in turn, a random stop sequence and grace each), '
            f'shutdown timeout {cfg.shutdown_timeout} s'
            if cfg.deploys
            else ''
        )
    )


def to_json(results: Sequence[SideResult], cfg: Config) -> dict[str, Any]:
    """Rows, violations and the plan's parameters, for files and tests."""
    plan = make_plan(cfg)
    return {
        'command': cfg.command(),
        'config': {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        'freeze_seconds': cfg.freeze_seconds,
        'rq': rq.__version__,
        'date': datetime.now(timezone.utc).strftime('%Y-%m-%d'),
        'faults': [asdict(f) for f in plan.faults],
        'sides': {
            r.side: {
                'row': r.row(),
                'violations': r.violations,
                'histories': r.histories,
                'notes': r.notes,
                'healthy_failed': [
                    {
                        'id': j.id,
                        'failure': j.failure,
                        'executions': j.executions,
                        'reasons': [a.reason for a in j.attempts if a.reason],
                    }
                    for j in r.jobs
                    if j.kind == 'healthy' and j.state == 'failed'
                ],
                'not_ended': [
                    {'id': j.id, 'state': j.state, 'status': j.status, 'where': j.where}
                    for j in r.jobs
                    if j.state in ('lost', 'stuck')
                ],
                'events': r.events,
            }
            for r in results
        },
    }
