"""Moved to :mod:`rq_epoch.ops.cli`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .ops.cli import *  # noqa: F403
from .ops.cli import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.ops.cli')
