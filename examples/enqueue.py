"""Enqueue jobs with their own stall budgets (max_stalled).

Run it, then a worker in this folder:

    RQ_REDIS_URL=redis://127.0.0.1:6379/0 python enqueue.py
    rq worker --url redis://127.0.0.1:6379/0 --worker-class rq_epoch.Worker --burst default

A stall is counted only when a job's worker went away while the server stayed up; a lease
that crossed a server restart or failover is requeued without being counted.
"""

from __future__ import annotations

import os

from redis import Redis

from rq_epoch import Queue


def main() -> None:
    connection = Redis.from_url(os.environ.get('RQ_REDIS_URL', 'redis://127.0.0.1:6379/0'))
    queue = Queue('default', connection=connection)

    # Charging a card must not run again after its worker died: the first counted stall
    # dead-letters it (FailedJobRegistry, on_failure callback), for a person to look at.
    charge = queue.enqueue('tasks.charge_card', 'order-1001', 4200, max_stalled=1)

    # A thumbnail is idempotent: let it survive up to four worker deaths.
    thumbnail = queue.enqueue('tasks.make_thumbnail', 'photo-17.jpg', max_stalled=5)

    # No max_stalled: the setting of the sweeping worker or cron applies (RQ_EPOCH_MAX_STALLED, default 3).
    report = queue.enqueue('tasks.send_report', 'weekly')

    for job in (charge, thumbnail, report):
        budget = job.max_stalled if job.max_stalled is not None else 'default'
        print(f'{job.id} {job.func_name} max_stalled={budget}')


if __name__ == '__main__':
    main()
