"""Moved to :mod:`rq_epoch.worker.flavours`; this path still works in 0.3, with a DeprecationWarning."""

from ._moved import moved
from .worker.flavours import *  # noqa: F403
from .worker.flavours import __all__ as __all__

__getattr__ = moved(__name__, 'rq_epoch.worker.flavours')
