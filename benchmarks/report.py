"""The benchmarks' results as Markdown: one section per benchmark, printed at the end of its run.

``python -m benchmarks.report [RESULTS_DIR]`` prints every section of the last run (``benchmarks/results/*.json``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .harness import EPOCH, RESULTS_DIR, STOCK, write_results

CASE_LABELS = {
    'stock-retry': 'stock cleanup, requeue (retry left)',
    'exempt': 'rq-epoch sweep, exempt (requeue)',
    'recovered': 'rq-epoch sweep, recovered (requeue)',
    'stock-fail': 'stock cleanup, fail + side effects',
    'dead': 'rq-epoch sweep, dead + side effects',
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


def _target(met: bool | None, text: str) -> str:
    if met is None:
        return '–'
    return f'{text} met' if met else f'{text} **missed**'


def sweep_section(doc: dict[str, Any]) -> str:
    """sweep_vs_cleanup: seconds, cost per lease and speed-up per case and size."""
    rows = []
    for r in doc['rows']:
        speedup = f'{r["speedup"]:g}×' if r['speedup'] is not None else None
        target = None if r['target_speedup'] is None else _target(r['target_met'], f'≥{r["target_speedup"]:g}×')
        rows.append(
            [
                r['n'],
                CASE_LABELS[r['case']],
                r['seconds'],
                r['us_per_lease'],
                r['round_trips'],
                r['server_commands'],
                speedup,
                target,
                r['ok'],
            ]
        )
    headers = ['N', 'who cleans, verdict', 'seconds', 'µs / lease', 'round trips', 'server commands', 'speed-up']
    return '### Sweep vs stock cleanup (same jobs, same server)\n\n' + md_table([*headers, 'target', 'ok'], rows)


def latency_section(doc: dict[str, Any]) -> str:
    """sweep_latency: PING latency while each side cleans, and the batch study."""
    base = doc['baseline']
    rows: list[list[Any]] = [['nothing (baseline)', None, base['p50_ms'], base['p99_ms'], base['max_ms'], None]]
    for r in doc['during']:
        label = CASE_LABELS[r['case']]
        rows.append([label, r['n'], r['p50_ms'], r['p99_ms'], r['max_ms'], r['server_blocks']['longest_ms']])
    headers = ['while', 'N', 'PING p50 ms', 'PING p99 ms', 'PING max ms', 'longest block ms']
    batch_rows = [
        [
            r['batch'],
            r['leases_per_second'],
            r['script'].get('ms_mean'),
            r['script'].get('us_per_member'),
            r['script_p99_ms'],
            r['longest_ms'],
            r['scripts_over_5ms'],
            r['ping_p99_ms'],
        ]
        for r in doc['batch_study']
    ]
    batch_headers = ['batch', 'leases/s', 'mean call ms', 'server µs/lease', 'p99 call ms', 'longest ms']
    n = doc['batch_study'][0]['n'] if doc['batch_study'] else 0
    return (
        '### What a cleanup does to other clients\n\n'
        + md_table(headers, rows)
        + f'\n\nBatch size (sweep of {n:,} exempt leases at each size):\n\n'
        + md_table([*batch_headers, 'calls > 5 ms', 'PING p99 ms'], batch_rows)
    )


#: What worker_throughput's summary reports for each side (the mean over its runs), and its
#: decimals; the columns of its section follow this order.
THROUGHPUT_FIGURES = {
    'jobs_per_second': 1,
    'steady_jobs_per_second': 1,
    'reads_per_job': 2,
    'commands_per_job': 2,
    'scripts_per_job': 2,
    'worker_cpu_ms_per_job': 3,
    'worker_system_cpu_ms_per_job': 3,
    'page_faults_per_job': 1,
    'server_cpu_ms_per_job': 3,
    'script_server_ms_per_job': 3,
}
#: The figures whose ratio to stock the summary gives (rq-epoch's, and each part's).
THROUGHPUT_RATIOS = ('worker_cpu_ms_per_job', 'page_faults_per_job', 'server_cpu_ms_per_job')


def throughput_section(doc: dict[str, Any]) -> str:
    """worker_throughput: jobs per second per side (and per part left out, with ``--parts``), and the ratios."""
    s = doc['summary']
    n = doc['runs'][0]['n'] if doc['runs'] else 0
    parts = [key for key, value in s.items() if isinstance(value, dict) and key not in (STOCK, EPOCH)]
    sides = [STOCK, EPOCH, *parts]
    runs = {side: sum(1 for r in doc['runs'] if r['side'] == side) for side in sides}
    figures = [figure for figure in THROUGHPUT_FIGURES if figure not in ('jobs_per_second', 'steady_jobs_per_second')]
    rows = [
        [
            f'`rq worker` ({side}, {runs[side]} runs)',
            s[side]['jobs_per_second'],
            s[side]['steady_jobs_per_second'],
            *(s[side].get(figure) for figure in figures),
        ]
        for side in sides
    ]

    def ratio_row(label: str, of: dict[str, Any], steady: Any) -> list[Any]:
        cells = [of.get(f'{figure}_ratio') if figure in THROUGHPUT_RATIOS else None for figure in figures]
        return [label, of['ratio'], steady, *cells]

    rows.append(ratio_row('ratio rq-epoch / stock', s, s['steady_ratio']))
    rows += [ratio_row(f'ratio {side} / stock', s[side], None) for side in parts]
    headers = [f'{n:,} no-op jobs, fork per job', 'jobs/s (whole run)', 'jobs/s (first start to last end)']
    load = f'\n\nLoad average (1 min) at the end: {doc["load_average"]}.' if 'load_average' in doc else ''
    return (
        '### Worker throughput\n\n'
        + md_table(
            [
                *headers,
                'requests / job',
                'commands / job',
                'script calls / job',
                'worker + work-horse CPU ms / job',
                'of which in the kernel ms / job',
                'page faults / job',
                'server CPU ms / job',
                'of which in scripts ms / job',
            ],
            rows,
        )
        + load
        + f'\n\nTarget ≥{s["target"]}×: {_target(s["target_met"], "").strip()}.'
    )


def heartbeat_section(doc: dict[str, Any]) -> str:
    """heartbeat: round trips, commands and time per heartbeat, per side."""
    real, lat = doc['real_workers'], doc['latency']
    rows: list[list[Any]] = [
        [
            side,
            real[side]['heartbeats'],
            '/'.join(map(str, real[side]['round_trips_per_heartbeat'])),
            '/'.join(map(str, real[side]['commands_per_heartbeat'])),
            real[side]['script_exists_sent'],
            lat[side]['p50_us'],
            lat[side]['p99_us'],
        ]
        for side in (STOCK, EPOCH)
    ]
    rows.append(['ratio', None, None, None, None, lat['ratio_p50'], None])
    headers = ['worker', 'heartbeats (real workers)', 'round trips / heartbeat', 'commands / heartbeat']
    headers += ['SCRIPT EXISTS', f'p50 µs ({lat[STOCK]["heartbeats"]:,} beats)', 'p99 µs']
    idle, targets = doc['idle_sweep'], doc['targets']
    return (
        '### Heartbeats\n\n'
        + md_table(headers, rows)
        + f'\n\nNo extra round trip: {_target(targets["no_extra_round_trip"], "").strip()}; '
        f'latency ≤1.2× stock: {_target(targets["latency_ratio_met"], "").strip()}. '
        f"A worker's periodic sweep with nothing expired: {'/'.join(map(str, idle['round_trips']))} round trips, "
        f'p50 {idle["p50_us"]} µs (once per sweep interval, not per heartbeat).'
    )


def memory_section(doc: dict[str, Any]) -> str:
    """memory: bytes rq-epoch adds per running job."""
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
    headers = ['job', 'running jobs', 'job hash bytes (encoding)', '+ stamp fields', '+ lease entry']
    return '### Server memory per running job\n\n' + md_table([*headers, 'added bytes / job', 'target'], rows)


def detection_section(doc: dict[str, Any]) -> str:
    """detection: seconds from a worker's death to its job running again."""
    rows = [[i + 1, r['side'], r.get('detection_seconds', r.get('error')), r['ok']] for i, r in enumerate(doc['runs'])]
    s = doc['summary']
    return (
        "### Time until a dead worker's job runs again\n\n"
        + md_table(['trial', 'worker', 'seconds until the job runs again', 'ok'], rows)
        + f'\n\nSettings: {s["settings_used"]}. rq-epoch worst {_fmt(s[EPOCH]["max"])} s '
        f'(target ≤{s["target_seconds"]:g} s); stock {_fmt(s[STOCK]["max"])} s.'
    )


def deploy_section(doc: dict[str, Any]) -> str:
    """deploy: seconds from a stop signal until the job runs again on another worker, per stop."""
    rows = []
    for r in doc['summary']:
        seconds = None
        if r['median_seconds'] is not None:
            seconds = f'{_fmt(r["median_seconds"])} (worst {_fmt(r["max_seconds"])})'
        outcome = '; '.join(r['outcomes'] + r['reasons'])
        if r.get('failed_seconds') is not None:
            outcome += f' ({_fmt(r["failed_seconds"])} s after the stop signal)'
        rows.append([r['side'], r['sequence'], r['grace'], r['trials'], seconds, outcome, r['stalled'], r['ok']])
    headers = ['worker', 'stop', 'grace (s)', 'trials', 'seconds until it runs again, median', 'the job']
    settings = doc['settings']
    return (
        '### A job cut short by a deploy\n\n'
        + md_table([*headers, 'counted stalls', 'ok'], rows)
        + f'\n\nSettings: rq-epoch {settings["rq-epoch"]}; stock {settings["stock"]}.'
    )


def pickup_section(doc: dict[str, Any]) -> str:
    """pickup: latency after idle and under load, backlog, the wait alone."""
    s = doc['summary']
    runs = {side: sum(1 for r in doc['runs'] if r['side'] == side) for side in (STOCK, EPOCH)}
    rows: list[list[Any]] = [
        [
            f'{side} ({runs[side]} run{"s" if runs[side] > 1 else ""})',
            s[side]['after_idle_p50_ms'],
            s[side]['after_idle_max_ms'],
            s[side]['load_p50_ms'],
            s[side]['load_p99_ms'],
            s[side]['load_mean_ms'],
            s[side]['backlog_jobs_per_second'],
            s[side]['backlog_reads_per_job'],
        ]
        for side in (STOCK, EPOCH)
    ]
    r = s['ratio']
    rows.append(['ratio', r['after_idle_p50'], None, r['load_p50'], None, r['load_mean'], r['backlog_jobs_per_second']])
    rows[-1].append(None)
    headers = [f'worker on {doc["queues"]} queues', 'after idle p50 ms', 'max ms', 'under load p50 ms', 'p99 ms']
    alone = doc['wait_alone']
    alone_rows = [[side, alone[side]['n'], alone[side]['p50_ms'], alone[side]['p99_ms']] for side in (STOCK, EPOCH)]
    return (
        '### Picking up jobs on several queues\n\n'
        + md_table([*headers, 'mean ms', 'backlog jobs/s', 'requests/job'], rows)
        + f'\n\nUnder load (p50) ≤{s["load_target"]}× stock: {_target(s["load_target_met"], "").strip()}.\n\n'
        + md_table(['enqueue → dequeue returns (no fork)', 'samples', 'p50 ms', 'p99 ms'], alone_rows)
    )


def _pair(cell: dict[str, Any], figure: str, ratio_key: str | None = None) -> str:
    """``stock → rq-epoch (ratio×)`` of one figure of a fleet cell."""
    stock, epoch = cell[STOCK], cell[EPOCH]
    if figure not in stock and not figure.startswith('pickup_'):  # a run from before the figure existed
        return '–'
    if figure.startswith('pickup_'):
        s, e = stock['pickup'][f'{figure[7:]}_ms'], epoch['pickup'][f'{figure[7:]}_ms']
    else:
        s, e = stock[figure], epoch[figure]
    if figure in ('commands_per_job', 'idle_commands_per_second'):
        s, e = round(s), round(e)
    if figure.endswith('_per_job') and e <= 0:  # below the idle rate: see the note on the clients' CPU
        return f'{_fmt(s)} → not measurable'
    r = cell['ratio'].get(ratio_key or figure)
    return f'{_fmt(s)} → {_fmt(e)}' + (f' ({r:g}×)' if r is not None else '')


def fleet_section(doc: dict[str, Any]) -> str:
    """fleet: the fleet's cost, stock → rq-epoch per cell, growth with W, the targets."""
    headers = [
        'workers × queues',
        'idle server CPU ms/s',
        'idle commands/s',
        'connections',
        'server CPU per job ms',
        'of which in the kernel ms',
        'commands per job',
        'script calls per job',
        'requests per job',
        'pickup p50 ms',
        'pickup p99 ms',
        'load',
    ]
    rows = []
    for cell in doc['cells'] + doc['simulated']:
        label = f'{cell["workers"]:,} × {cell["queues"]}'
        if cell[STOCK].get('simulated'):
            label = f'{cell["workers"]:,} simulated × {cell["queues"]}'
        rows.append(
            [label]
            + [_pair(cell, f) for f in ('idle_cpu_ms_per_second', 'idle_commands_per_second', 'connections')]
            + [
                _pair(cell, f)
                for f in (
                    'cpu_ms_per_job',
                    'system_cpu_ms_per_job',
                    'commands_per_job',
                    'scripts_per_job',
                    'requests_per_job',
                )
            ]
            + [_pair(cell, f) for f in ('pickup_p50', 'pickup_p99')]
            + [f'{_fmt(cell[STOCK].get("load_average"))} / {_fmt(cell[EPOCH].get("load_average"))}']
        )
    out = '### A fleet of workers: idle cost and cost per job (stock → rq-epoch)\n\n' + md_table(headers, rows)
    sizes, sim = doc['sizes'], doc['simulated_sizes']
    out += (
        f'\n\nIdle window {sizes["idle"]:g} s; {sizes["jobs"]} no-op jobs at {sizes["rate"]:g}/s '
        f'({sim["jobs"]} at {sim["rate"]:g}/s for the simulated fleet), costs above the idle rate.'
    )
    if doc.get('repeat', 1) > 1:
        out += (
            f' Each real cell ran {doc["repeat"]} fleets per side, in alternating order; the figures are'
            " each side's medians, the ratios theirs."
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


def page_section(doc: dict[str, Any]) -> str:
    """page_viewers: the server's commands per second for the page's viewers, without and with the cache."""
    rows = [
        [
            r['viewers'],
            'cache' if r['cache'] else 'no cache',
            r['pages_per_second'],
            r['commands_per_second'],
            r['renders_per_period'],
            r['page_ms']['p50_ms'],
            r['page_ms']['p99_ms'],
            r['ok'],
        ]
        for r in doc['rows']
    ]
    headers = ['viewers', 'exporter', 'pages/s', 'server commands/s', 'renders per refresh period']
    ratios = ', '.join(
        f'{r["viewers"]} viewer{"s" if r["viewers"] > 1 else ""} {_fmt(r["commands_per_second"])}×'
        for r in doc['ratios']
    )
    state = doc['state']
    return (
        "### The exporter's page with many viewers\n\n"
        + md_table([*headers, 'page p50 ms', 'page p99 ms', 'ok'], rows)
        + f'\n\nEach viewer reloads {doc["refresh_seconds"]} s after the page arrived; '
        f'{doc["window_seconds"]:g} s counted per row; '
        f'{state["queues"]} queues holding {state["running"]} running jobs, {state["queued"]} waiting, '
        f'{state["stalled"]} with a counted stall, {state["dead"]} dead letters; one render costs the server '
        f'{doc["commands_per_render"]} commands. Server commands per second, without / with the cache: {ratios}.'
    )


def durable_section(doc: dict[str, Any]) -> str:
    """durable: per-job latency and one worker's throughput, with and without ``RQ_EPOCH_DURABLE_REPLICAS=1``."""
    rates = {r['side']: r for r in doc['throughput']}
    rows = [
        [f'`rq worker` ({r["side"]})', r['p50_ms'], r['p90_ms'], r['p99_ms'], rates[r['side']]['jobs_per_second']]
        for r in doc['latency']
    ]
    n = doc['throughput'][0]['n'] if doc['throughput'] else 0
    m = doc['latency'][0]['m'] if doc['latency'] else 0
    s = doc['summary']
    enqueue_rows = [[what, e['p50_ms'], e['p99_ms']] for what, e in doc['enqueue'].items()]
    return (
        f'### Durable grants and outcomes ({doc["server"]}, {doc["replicas"]} replica on loopback)\n\n'
        + md_table(
            [
                'side',
                f'latency p50 ms ({m} jobs one at a time)',
                'p90 ms',
                'p99 ms',
                f'jobs/s ({n:,} no-op jobs, one worker)',
            ],
            rows,
        )
        + f'\n\nThroughput durable / rq-epoch: {_fmt(s["throughput_durable_over_epoch"])}; durable / stock: '
        + f'{_fmt(s["throughput_durable_over_stock"])}; latency p50 added: {_fmt(s["latency_p50_added_ms"])} ms.\n\n'
        + md_table(['`rq_epoch.Queue.enqueue`', 'p50 ms', 'p99 ms'], enqueue_rows)
    )


#: Each benchmark's section, by the benchmark's name; the order of the full report.
SECTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    'sweep_vs_cleanup': sweep_section,
    'sweep_latency': latency_section,
    'worker_throughput': throughput_section,
    'durable': durable_section,
    'heartbeat': heartbeat_section,
    'memory': memory_section,
    'detection': detection_section,
    'deploy': deploy_section,
    'pickup': pickup_section,
    'fleet': fleet_section,
    'page_viewers': page_section,
}


def finish(name: str, doc: dict[str, Any], out: Path | None, ok: bool, conn: Any = None) -> int:
    """Write a benchmark's JSON, print its section; the exit code (1: some job did not end where it should)."""
    path = write_results(name, doc, out, conn)
    print(SECTIONS[name](json.loads(path.read_text(encoding='utf-8'))))
    return 0 if ok else 1


def markdown(results: Path = RESULTS_DIR) -> str:
    """Every section whose results exist, after the environment of the run."""
    parts, env = [], None
    for name, render in SECTIONS.items():
        path = results / f'{name}.json'
        if path.exists():
            doc = json.loads(path.read_text(encoding='utf-8'))
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
