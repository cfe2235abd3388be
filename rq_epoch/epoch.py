"""Moved to :mod:`rq_epoch.protocol.epoch`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .protocol.epoch import *  # noqa: F403
from .protocol.epoch import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.protocol.epoch')
