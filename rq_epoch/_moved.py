"""The module paths of the flat layout before 0.3, kept for one release with a DeprecationWarning.

Each old path (``rq_epoch/take.py`` and the like) is a module of three lines: it imports every
public name of the module that took its place, warns, and answers any other name from that
module (:func:`moved`), so that what was importable from the old path still is, as the same
objects. They go in 0.4.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ['moved']


def moved(old: str, new: str) -> Callable[[str], Any]:
    """Warn that module ``old`` moved to ``new``; return the ``__getattr__`` of ``old``."""
    module = importlib.import_module(new)
    warnings.warn(
        f'{old} moved to {new}: import it from there ({old} goes in 0.4)',
        DeprecationWarning,
        stacklevel=3,  # the line that imports the old path (import machinery frames are skipped)
    )

    def __getattr__(name: str) -> Any:
        return getattr(module, name)

    return __getattr__
