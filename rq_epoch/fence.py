"""Moved to :mod:`rq_epoch.worker.fence`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .worker.fence import *  # noqa: F403
from .worker.fence import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.worker.fence')
