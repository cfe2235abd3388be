"""Pytest plugin that runs RQ's own test suite against rq-epoch.

Loaded with ``-p rq_epoch_suite`` (this folder on ``PYTHONPATH``) before RQ's tests are
imported, and by ``sitecustomize`` in every subprocess RQ's tests start (``rqworker``, the
work-horse of a spawn worker). Environment:

* ``RQ_SUITE_PORT``: RQ's tests connect to ``localhost:6379``; connections to that
  address go to this loopback port instead (the suite's own server).
* ``RQ_SUITE_SUBSTITUTE``: ``1`` rebinds RQ's worker classes to rq-epoch's before RQ's
  tests import them: ``rq.Worker`` / ``rq.worker.Worker`` become ``rq_epoch.Worker``,
  ``rq.SimpleWorker``, ``rq.SpawnWorker`` and ``rq.HerokuWorker`` become rq-epoch's.
  ``0`` (or unset) runs stock RQ, for the comparison.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_installed = False


def _redirect(port: int) -> None:
    import redis.connection

    original = redis.connection.Connection.__init__
    if getattr(original, '_rq_suite', False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not args and kwargs.get('host', 'localhost') in ('localhost', '127.0.0.1'):
            if int(kwargs.get('port', 6379)) == 6379:
                kwargs['host'] = '127.0.0.1'
                kwargs['port'] = port
        original(self, *args, **kwargs)

    __init__._rq_suite = True  # type: ignore[attr-defined]
    redis.connection.Connection.__init__ = __init__  # type: ignore[method-assign]


def _substitute() -> None:
    import rq
    import rq.worker
    import rq.worker_pool

    import rq_epoch

    flavours = [f for f in os.environ.get('RQ_SUITE_FLAVOURS', 'SimpleWorker,SpawnWorker,HerokuWorker').split(',') if f]
    for module in (rq, rq.worker):
        module.Worker = rq_epoch.Worker  # type: ignore[attr-defined,misc]
        for name in flavours:
            if hasattr(module, name) and hasattr(rq_epoch, name):
                setattr(module, name, getattr(rq_epoch, name))
    rq.worker_pool.Worker = rq_epoch.Worker  # type: ignore[attr-defined,misc]


def pytest_configure(config: Any) -> None:
    """Keep the test runner alive when one of RQ's tests signals the runner's own process group.

    RQ's ``HerokuWorker`` test of the warm shutdown forks a child that moves itself into a
    process group of its own, waits 0.1 s, then sends SIGRTMIN to the child's group. When the
    child has not moved yet (a loaded machine), the signal goes to the group the child shares
    with pytest, whose default action ends pytest. Pytest ignores it here; a child forked from
    it inherits the handler and dies of the signal as it would by default, which is what the
    test checks; one that arrives before the child has finished forking is lost (CPython
    clears the signals caught in that instant), the test then fails, and ``run.py`` runs it
    again. (``run.py`` starts pytest in a session of its own, so such a signal cannot reach
    what started it.)
    """
    sigrtmin = getattr(signal, 'SIGRTMIN', None)
    if sigrtmin is None:
        return
    runner = os.getpid()

    def shield(signum: int, frame: Any) -> None:
        if os.getpid() == runner:
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(sigrtmin, shield)


def install() -> None:
    """Apply what the environment asks for (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    port = os.environ.get('RQ_SUITE_PORT', '').strip()
    if port:
        _redirect(int(port))
    if os.environ.get('RQ_SUITE_SUBSTITUTE', '').strip() == '1':
        _substitute()


install()
