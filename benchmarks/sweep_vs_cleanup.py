"""How much faster than RQ's own cleanup does rq-epoch's sweep clean expired leases?

For each size N, each case of :mod:`benchmarks.fixture` gets N expired leases on a flushed
server and cleans them once: wall seconds, microseconds per lease, round trips the cleaning
client made (counted in redis-py), commands the server ran (INFO commandstats, commands
inside scripts included), and the speed-up over the matching stock case: requeues
(``exempt``, ``recovered``) against stock's requeue of jobs with a retry left, dead letters
with all their side effects (``dead``) against stock's failing of jobs with none.

    python -m benchmarks.sweep_vs_cleanup            # N = 1,000, 10,000, 100,000
    python -m benchmarks.sweep_vs_cleanup --quick    # N = 200
    python -m benchmarks.sweep_vs_cleanup --sizes 10000 --cases stock-fail,dead --repeat 3

``--repeat R`` runs every case R times at each size, one round after the other, and keeps
each case's median time (every run's time is in the JSON): on a shared machine, the ratio
then compares like with like.
"""

from __future__ import annotations

from typing import Any

from .fixture import BASELINE, CASES, Outcome, run_case
from .harness import comma_sizes, parser, quiet_logging, ratio, server, server_version
from .report import finish

NAME = 'sweep_vs_cleanup'
#: Speed-up over stock asked of rq-epoch: requeues at N >= 10,000, dead letters with their side effects.
TARGETS = {'exempt': 50.0, 'recovered': 50.0, 'dead': 2.0}


def row(outcome: Outcome, runs: list[float], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """One case at one size, as the JSON and the report show it."""
    n = outcome.n
    seconds = round(outcome.seconds, 4)
    # From the times as reported, so that the ratio of the two rows' seconds is the speed-up shown.
    speedup = ratio(baseline['seconds'], seconds) if baseline else None
    target = TARGETS.get(outcome.case) if outcome.case == 'dead' or n >= 10_000 else None
    return {
        'case': outcome.case,
        'side': outcome.side,
        'n': n,
        'seconds': seconds,
        'runs_seconds': runs,
        'us_per_lease': round(outcome.seconds / n * 1e6, 2),
        'round_trips': outcome.round_trips,
        'server_commands': outcome.server_commands,
        'script': outcome.script,
        'vs': BASELINE.get(outcome.case),
        'speedup': speedup,
        'target_speedup': target,
        'target_met': None if target is None or speedup is None else speedup >= target,
        'checks': outcome.checks,
        'ok': outcome.ok,
    }


def run(kind: str, sizes: tuple[int, ...], cases: list[str], repeat: int) -> dict[str, Any]:
    """Every case at every size, ``repeat`` rounds; the median run of each is kept."""
    quiet_logging()
    rows: list[dict[str, Any]] = []
    with server(kind) as srv:
        conn = srv.client()
        for n in sizes:
            runs: dict[str, list[Outcome]] = {case: [] for case in cases}
            for _ in range(repeat):
                for case in cases:
                    runs[case].append(run_case(conn, case, n))
                    print(f'  n={n:>7,} {case:<12} {runs[case][-1].seconds:>9.3f}s', flush=True)
            done: dict[str, dict[str, Any]] = {}
            for case in cases:
                ordered = sorted(runs[case], key=lambda o: o.seconds)
                median = ordered[(len(ordered) - 1) // 2]
                median.ok = all(o.ok for o in ordered)
                times = [round(o.seconds, 4) for o in runs[case]]
                done[case] = row(median, times, done.get(BASELINE.get(case, '')))
                rows.append(done[case])
        return {'server': server_version(conn), 'sizes': list(sizes), 'repeat': repeat, 'rows': rows}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--sizes', type=comma_sizes, help='comma-separated sizes (default 1000,10000,100000; quick 200)')
    p.add_argument('--cases', default=','.join(CASES), help=f'comma-separated, of {", ".join(CASES)} (default all)')
    p.add_argument('--repeat', type=int, default=1, help='runs of each case; the median is kept (default 1)')
    args = p.parse_args(argv)
    cases = [c for c in CASES if c in args.cases.split(',')]  # each stock case before those compared with it
    unknown = set(args.cases.split(',')) - set(CASES) - {''}
    if unknown or not cases or args.repeat < 1:
        p.error(f'--cases takes {", ".join(CASES)} and --repeat at least 1')
    sizes = args.sizes or ((200,) if args.quick else (1_000, 10_000, 100_000))
    doc = {'quick': args.quick, **run(args.server, sizes, cases, args.repeat)}
    return finish(NAME, doc, args.out, all(r['ok'] for r in doc['rows']))


if __name__ == '__main__':
    raise SystemExit(main())
