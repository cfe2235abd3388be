"""Moved to :mod:`rq_epoch.jobs.queue`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .jobs.queue import *  # noqa: F403
from .jobs.queue import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.jobs.queue')
