"""Moved to :mod:`rq_epoch.jobs.jobclass`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .jobs.jobclass import *  # noqa: F403
from .jobs.jobclass import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.jobs.jobclass')
