"""Run every benchmark but ``detection`` in turn, then print the report (``python -m benchmarks [--quick]``)."""

from __future__ import annotations

import sys
import time

from . import (
    deploy,
    durable,
    fleet,
    heartbeat,
    memory,
    page_viewers,
    pickup,
    report,
    sweep_latency,
    sweep_vs_cleanup,
    worker_throughput,
)

MODULES = (
    sweep_vs_cleanup,
    sweep_latency,
    worker_throughput,
    durable,
    heartbeat,
    memory,
    pickup,
    fleet,
    page_viewers,
    deploy,
)


def main(argv: list[str] | None = None) -> int:
    """Pass ``--quick`` / ``--server`` to each benchmark; results go to benchmarks/results/."""
    args = list(sys.argv[1:] if argv is None else argv)
    passed = [a for a in args if a in ('--quick',)]
    if '--server' in args:
        i = args.index('--server')
        passed += args[i : i + 2]
    status = 0
    start = time.perf_counter()
    for module in MODULES:
        print(f'\n=== {module.__name__}', flush=True)
        status |= module.main(passed)
    print(f'\nall benchmarks: {time.perf_counter() - start:.0f} s\n')
    print(report.markdown())
    return status


if __name__ == '__main__':
    raise SystemExit(main())
