"""Runs rq-epoch's worker as a program of its own does, not through ``rq worker``.

``python -m tests.launch_worker URL QUEUE...``. RQ's command line asks the server whether
workers are suspended before it makes the worker, so with the server down it exits before
any rq-epoch code runs; a program that makes the worker itself (django-rq's command, a
service's own entry point) reaches the worker's start-up wait.
"""

from __future__ import annotations

import sys

import redis

from rq_epoch import Queue, Worker


def main(argv: list[str]) -> None:
    url, *names = argv
    connection = redis.Redis.from_url(url)
    worker = Worker([Queue(name, connection=connection) for name in names], connection=connection)
    worker.work(logging_level='INFO')


if __name__ == '__main__':
    main(sys.argv[1:])
