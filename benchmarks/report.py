"""The results of the last run (``benchmarks/results/*.json``) as Markdown tables.

python -m benchmarks.report [RESULTS_DIR]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import EPOCH, RESULTS_DIR, STOCK

CASE_LABELS = {
    'stock-retry': 'stock cleanup, requeue (retry left)',
    'exempt': 'rq-epoch sweep, exempt (requeue)',
    'recovered': 'rq-epoch sweep, recovered (requeue)',
    'stock-fail': 'stock cleanup, fail + side effects',
    'dead': 'rq-epoch sweep, dead + side effects',
    'dead-floor': "floor: RQ's failure side effects alone, batched",
}


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join('---' for _ in headers) + '|']
    lines += ['| ' + ' | '.join(_fmt(x) for x in row) + ' |' for row in rows]
    return '\n'.join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return '–'
    if isinstance(value, bool):
        return 'yes' if value else '**no**'
    if isinstance(value, float):
        if value >= 100:
            return f'{value:,.0f}'
        return f'{value:.3g}' if value < 1 else f'{value:.2f}'
    if isinstance(value, int):
        return f'{value:,}'
    return str(value)


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f'{name}.json'
    return json.loads(path.read_text(encoding='utf-8')) if path.exists() else None


def _target(met: bool | None, text: str) -> str:
    if met is None:
        return '–'
    return f'{text} met' if met else f'{text} **missed**'


def sweep_section(doc: dict[str, Any]) -> str:
    rows = []
    for r in doc['rows']:
        label = CASE_LABELS.get(r['case'], r['case'])
        if r.get('skipped'):
            rows.append([r['n'], label, f'not run (≈{r["estimated_seconds"]} s est.)', None, None, None, None, None])
            continue
        speedup = f'{r["speedup"]:g}×' if r.get('speedup') is not None else None
        target = None if r.get('target_speedup') is None else _target(r['target_met'], f'≥{r["target_speedup"]:g}×')
        rows.append(
            [
                r['n'],
                label,
                round(r['seconds'], 3),
                r['members_per_second'],
                r['round_trips'],
                r['server_commands'],
                speedup,
                target,
            ]
        )
    headers = [
        'N',
        'who cleans, verdict',
        'seconds',
        'members/s',
        'round trips',
        'server commands',
        'speed-up',
        'target',
    ]
    return '### 1. Sweep vs stock cleanup (same jobs, same server)\n\n' + md_table(headers, rows)


def latency_section(doc: dict[str, Any]) -> str:
    base = doc['baseline']
    rows: list[list[Any]] = [['nothing (baseline)', None, base['p50_ms'], base['p99_ms'], base['max_ms'], None, None]]
    targets = doc['targets']
    for r in doc['during']:
        blocks = r['server_blocks']
        p99_calls = blocks.get('script_p99_ms') if blocks.get('scripts_logged') else None
        rows.append(
            [
                CASE_LABELS.get(r['case'], r['case']),
                r['n'],
                r['p50_ms'],
                r['p99_ms'],
                r['max_ms'],
                p99_calls,
                blocks['longest_ms'],
            ]
        )
    headers = ['while', 'N', 'PING p50 ms', 'PING p99 ms', 'PING max ms', 'script call p99 ms', 'longest block ms']
    out = '### 2. What a cleanup does to other clients\n\n' + md_table(headers, rows)
    batch_rows = [
        [
            r['batch'],
            r['members_per_second'],
            r['script_ms_mean'],
            r['script_us_per_member'],
            r.get('script_p99_ms'),
            r['longest_block_ms'],
            r.get('scripts_over_5ms'),
            r['ping_p99_ms'],
        ]
        for r in doc['batch_study']
    ]
    batch_headers = [
        'batch',
        'members/s',
        'mean call ms',
        'server µs/member',
        'p99 call ms',
        'longest ms',
        'calls > 5 ms',
        'PING p99 ms',
    ]
    n = doc['batch_study'][0]['n'] if doc['batch_study'] else 0
    out += f'\n\nBatch size (sweep of {n:,} exempt leases at each size):\n\n' + md_table(batch_headers, batch_rows)
    lines = []
    for case in ('exempt', 'recovered', 'stock-retry'):
        if case in targets:
            t = targets[case]
            lines.append(
                f'- {CASE_LABELS[case]}: longest block {t["longest_block_ms"]} ms '
                f'({_target(t["block_target_met"], "≤5 ms")}); PING p99 {t["p99_minus_baseline_ms"]:+} ms '
                f'vs baseline ({_target(t["p99_target_met"], "≤+2 ms")})'
            )
    return out + '\n\n' + '\n'.join(lines)


def throughput_section(doc: dict[str, Any]) -> str:
    s = doc['summary']
    n = doc['runs'][0]['n'] if doc['runs'] else 0
    runs = {side: sum(1 for r in doc['runs'] if r['side'] == side) for side in (STOCK, EPOCH)}
    rows = [
        [f'`rq worker` ({side}, {runs[side]} runs)', s[side]['jobs_per_second'], s[side]['steady_jobs_per_second']]
        for side in (STOCK, EPOCH)
    ]
    rows.append(['ratio rq-epoch / stock', s['ratio'], s['steady_ratio']])
    headers = [f'{n:,} no-op jobs, fork per job', 'jobs/s (whole run)', 'jobs/s (first start to last end)']
    return (
        '### 3. Worker throughput and heartbeats\n\n'
        + md_table(headers, rows)
        + f'\n\nTarget ≥{s["target"]}×: {_target(s["target_met"], "").strip()}.'
    )


def heartbeat_section(doc: dict[str, Any]) -> str:
    real, lat = doc['real_workers'], doc['latency']
    rows = []
    for side in (STOCK, EPOCH):
        rows.append(
            [
                side,
                real[side]['heartbeats'],
                '/'.join(map(str, real[side]['round_trips_per_heartbeat'])),
                '/'.join(map(str, real[side]['commands_per_heartbeat'])),
                real[side]['script_exists_sent'],
                lat[side]['p50_us'],
                lat[side]['p99_us'],
            ]
        )
    rows.append(['ratio', None, None, None, None, lat['ratio_p50'], None])
    headers = [
        'worker',
        'heartbeats (1 s jobs)',
        'round trips / heartbeat',
        'commands / heartbeat',
        'SCRIPT EXISTS',
        f'p50 µs ({lat[STOCK]["heartbeats"]:,} beats)',
        'p99 µs',
    ]
    idle = doc['idle_sweep']
    targets = doc['targets']
    return (
        md_table(headers, rows) + f'\n\nNo extra round trip: {_target(targets["no_extra_round_trip"], "").strip()}; '
        f'latency ≤1.2× stock: {_target(targets["latency_ratio_met"], "").strip()}. '
        f"A worker's periodic sweep with nothing expired: {'/'.join(map(str, idle['round_trips']))} round trips, "
        f'p50 {idle["p50_us"]} µs (once per sweep interval, not per heartbeat).'
    )


def memory_section(doc: dict[str, Any]) -> str:
    rows = [
        [
            r['shape'],
            r['n'],
            f'{r["job_hash_bytes_before"]:.0f} ({r["job_hash_encoding"]})',
            r['job_hash_bytes_added'],
            r['lease_set_bytes'],
            r['added_bytes_per_job'],
            _target(r['target_met'], '≤256 B'),
        ]
        for r in doc['rows']
    ]
    headers = [
        'job',
        'running jobs',
        'job hash bytes (encoding)',
        '+ stamp fields',
        '+ lease entry',
        'added bytes / job',
        'target',
    ]
    return '### 4. Server memory per running job\n\n' + md_table(headers, rows)


def pickup_section(doc: dict[str, Any]) -> str:
    s = doc['summary']
    sides = [side for side in (STOCK, EPOCH, 'rq-epoch, polling') if side in s]
    runs = {side: sum(1 for r in doc['runs'] if r['side'] == side) for side in sides}
    rows = []
    for side in sides:
        t = s[side]
        rows.append(
            [
                f'{side} ({runs[side]} run{"s" if runs[side] > 1 else ""})',
                t['wait_calls_per_second'],
                t['wait_server_us_per_second'],
                t['idle_requests_per_second'],
                t['after_idle_p50_ms'],
                t['after_idle_max_ms'],
                t['load_p50_ms'],
                t['load_p99_ms'],
                t['load_mean_ms'],
                t['backlog_jobs_per_second'],
                t['backlog_reads_per_job'],
            ]
        )
    r = s['ratio']
    rows.append(
        [
            'ratio rq-epoch / stock',
            None,
            None,
            None,
            r['after_idle_p50'],
            None,
            r['load_p50'],
            None,
            r['load_mean'],
            r['backlog_jobs_per_second'],
            None,
        ]
    )
    headers = [
        f'worker on {doc.get("queues", 3)} queues',
        'idle: wait calls/s',
        'idle: wait server µs/s',
        'idle: worker requests/s',
        'pickup after idle p50 ms',
        'max ms',
        'pickup under load p50 ms',
        'p99 ms',
        'mean ms',
        'backlog jobs/s',
        'requests/job',
    ]
    t = s['targets']
    unit = s['per_call_us']
    out = (
        '### 5. Picking up jobs on several queues\n\n'
        + md_table(headers, rows)
        + f'\n\nTargets: under load ≤{t["load_ratio"]}× stock (p50 and mean): '
        f'{_target(t["load_ratio_met"], "").strip()}; after idle ≤{t["after_idle_ms"]:g} ms: '
        f'{_target(t["after_idle_met"], "").strip()}; idle wait ≤{t["idle_calls_per_second"]:g} calls/s and '
        f'≤{t["idle_server_us_per_second"]:g} µs/s: {_target(t["idle_met"], "").strip()}. '
        f"Alone, an empty take costs {unit['take_empty']} µs of server time and the wake-up's `EXISTS` "
        f'{unit["exists"]} µs.'
    )
    fleets = doc.get('fleet') or []
    if fleets:
        fleet_rows = [
            [f['side'], f['workers'], f['wait_calls_per_job'], f['wait_server_us_per_job'], f['pickup']['p50_ms']]
            for f in fleets
        ]
        out += '\n\n' + md_table(
            ['idle fleet', 'workers', 'wait calls / job', 'wait server µs / job', 'pickup p50 ms'], fleet_rows
        )
    alone = doc.get('wait_alone')
    if alone:
        alone_rows = [
            [side, alone[side]['n'], alone[side]['p50_ms'], alone[side]['p90_ms'], alone[side]['p99_ms']]
            for side in (STOCK, EPOCH)
        ]
        out += '\n\n' + md_table(
            ['enqueue → dequeue returns (no fork)', 'samples', 'p50 ms', 'p90 ms', 'p99 ms'], alone_rows
        )
    return out


def _pair(cell: dict[str, Any], figure: str, ratio_key: str | None = None) -> str:
    """``stock → rq-epoch (ratio×)`` of one figure of a fleet cell."""
    stock, epoch = cell[STOCK], cell[EPOCH]
    if figure.startswith('pickup_'):
        s, e = stock['pickup'][f'{figure[7:]}_ms'], epoch['pickup'][f'{figure[7:]}_ms']
    else:
        s, e = stock[figure], epoch[figure]
    if 'commands' in figure:
        s, e = round(s), round(e)
    if figure.endswith('_per_job') and e <= 0:  # below the idle rate: see the note on the clients' CPU
        return f'{_fmt(s)} → not measurable'
    r = cell['ratio'].get(ratio_key or figure)
    return f'{_fmt(s)} → {_fmt(e)}' + (f' ({r:g}×)' if r is not None else '')


def fleet_section(doc: dict[str, Any]) -> str:
    """Question 6: the fleet's cost, stock → rq-epoch per cell, growth with W, the targets."""
    headers = [
        'workers × queues',
        'idle server CPU ms/s',
        'idle commands/s',
        'connections',
        'server CPU per job ms',
        'commands per job',
        'pickup p50 ms',
        'pickup p99 ms',
    ]
    rows = []
    for cell in doc['cells'] + doc['simulated']:
        label = f'{cell["workers"]:,} × {cell["queues"]}'
        if cell[STOCK].get('simulated'):
            label = f'{cell["workers"]:,} simulated × {cell["queues"]}'
        rows.append(
            [label]
            + [_pair(cell, f) for f in ('idle_cpu_ms_per_second', 'idle_commands_per_second', 'connections')]
            + [_pair(cell, f) for f in ('cpu_ms_per_job', 'commands_per_job', 'pickup_p50', 'pickup_p99')]
        )
    out = '### 6. A fleet of workers: idle cost and cost per job (stock → rq-epoch)\n\n' + md_table(headers, rows)
    sizes, sim = doc['sizes'], doc['simulated_sizes']
    out += (
        f'\n\nIdle window {sizes["idle"]:g} s; {sizes["jobs"]} no-op jobs at {sizes["rate"]:g}/s '
        f'({sim["jobs"]} at {sim["rate"]:g}/s for the simulated fleet), costs above the idle rate.'
    )
    for cell in doc['simulated']:
        busy = {
            side: f'{cell[side]["clients_cpu_percent_idle"]:g} / {cell[side]["clients_cpu_percent_jobs"]:g}'
            for side in (STOCK, EPOCH)
        }
        out += (
            f"\n\nThe simulated fleet's own processes used {busy[STOCK]} % of one core (idle / jobs) for stock, "
            f'{busy[EPOCH]} % for rq-epoch; a figure per job at or below zero means the clients, '
            'not the server, set the pace (their periodic work slowed while jobs ran).'
        )
    if doc['growth']:
        grown = [
            [
                f'{g["from_workers"]} → {g["to_workers"]} × {g["queues"]}',
                g['side'],
                g['cpu_per_job'],
                g['commands_per_job'],
            ]
            for g in doc['growth']
        ]
        out += '\n\n' + md_table(['per-job cost, workers', 'side', 'server CPU ×', 'commands ×'], grown)
    if doc['targets']:
        lines = [
            f'- {t["what"]}: {_fmt(t["value"])} ({_target(t["met"], "≤" + format(t["limit"], "g"))})'
            for t in doc['targets']
        ]
        out += '\n\n' + '\n'.join(lines)
    return out


def markdown(results: Path = RESULTS_DIR) -> str:
    """Every section whose results exist, with the environment of the run."""
    parts = []
    env = None
    loaders = (
        ('sweep_vs_cleanup', sweep_section),
        ('sweep_latency', latency_section),
        ('worker_throughput', throughput_section),
        ('heartbeat', heartbeat_section),
        ('memory', memory_section),
        ('pickup', pickup_section),
        ('fleet', fleet_section),
    )
    for name, render in loaders:
        doc = _load(results, name)
        if doc is None:
            continue
        env = env or doc.get('environment')
        parts.append(render(doc))
    if env:
        parts.insert(
            0,
            f'Run {env["date_utc"]} on {env.get("server", "?")}, {env["cpus"]} CPUs, Python {env["python"]}, '
            f'RQ {env["rq"]}, rq-epoch {env["rq_epoch"]} (commit {env.get("git", "?")}), redis-py {env["redis_py"]}.',
        )
    return '\n\n'.join(parts) + '\n'


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(markdown(Path(args[0]) if args else RESULTS_DIR))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
