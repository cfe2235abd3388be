"""Moved to :mod:`rq_epoch.worker.tickets`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .worker.tickets import *  # noqa: F403
from .worker.tickets import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.worker.tickets')
