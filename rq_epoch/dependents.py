"""Moved to :mod:`rq_epoch.sweep.dependents`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .sweep.dependents import *  # noqa: F403
from .sweep.dependents import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.sweep.dependents')
