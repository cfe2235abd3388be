"""Moved to :mod:`rq_epoch.protocol.server`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .protocol.server import *  # noqa: F403
from .protocol.server import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.protocol.server')
