"""Applies :mod:`rq_epoch_suite` in subprocesses that RQ's tests start (this folder is on PYTHONPATH)."""

import os

if os.environ.get('RQ_SUITE_PORT') or os.environ.get('RQ_SUITE_SUBSTITUTE'):
    import rq_epoch_suite  # noqa: F401
