"""``rq worker`` with every heartbeat's round trips, commands and time recorded.

Used by :mod:`benchmarks.heartbeat`: ``python -m benchmarks._probe_worker <rq worker
arguments>``, with ``BENCH_PROBE_OUT`` naming a file that gets one JSON line per
heartbeat. Both RQ's ``maintain_heartbeats`` and rq-epoch's are wrapped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rq.worker.base import BaseWorker

from rq_epoch.worker.worker import Worker as EpochWorker

from .harness import count_traffic


def _wrap(cls: type, out: str) -> None:
    original: Callable[..., Any] = cls.__dict__['maintain_heartbeats']

    def maintain_heartbeats(self: Any, *args: Any, **kwargs: Any) -> Any:
        with count_traffic() as traffic:
            start = time.perf_counter()
            result = original(self, *args, **kwargs)
            elapsed = time.perf_counter() - start
        record = {
            'worker': type(self).__module__,
            'round_trips': traffic.round_trips,
            'commands': traffic.commands,
            'us': round(elapsed * 1e6, 1),
        }
        with open(out, 'a', encoding='utf-8') as fh:
            fh.write(json.dumps(record) + '\n')
        return result

    setattr(cls, 'maintain_heartbeats', maintain_heartbeats)  # noqa: B010 - patching a method on a class


def main() -> None:
    out = os.environ['BENCH_PROBE_OUT']
    _wrap(BaseWorker, out)
    # rq-epoch's heartbeat lives in one of the layers of its Worker (rq_epoch.worker.heartbeats).
    _wrap(next(c for c in EpochWorker.__mro__ if 'maintain_heartbeats' in c.__dict__), out)
    from rq.cli import main as rq_main

    sys.argv = ['rq', *sys.argv[1:]]
    rq_main()


if __name__ == '__main__':
    main()
