"""Moved to :mod:`rq_epoch.jobs.job`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .jobs.job import StartedJobRegistry

__all__ = ['StartedJobRegistry']
__getattr__ = moved(__name__, 'rq_epoch.jobs.job')
