"""Moved to :mod:`rq_epoch.protocol.keys`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .protocol.keys import *  # noqa: F403
from .protocol.keys import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.protocol.keys')
