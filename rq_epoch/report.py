"""Moved to :mod:`rq_epoch.protocol.report`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .protocol.report import *  # noqa: F403
from .protocol.report import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.protocol.report')
