"""Job functions for the wheel smoke check, put on the worker's PYTHONPATH from a temp folder.

Nothing of the checkout is importable in the smoke's virtual environments: this module is
copied next to the probe, and the worker imports it by name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def add(a: int, b: int) -> int:
    """Return the sum: the job a burst worker runs to completion."""
    return a + b


def hang_once(marker: str, seconds: float = 120.0) -> str:
    """Hang on the first run (writing the work-horse's PID to ``marker``); return at once after.

    The smoke SIGKILLs the worker and this work-horse while it hangs, so that its lease
    expires under a live server; the requeued job then finishes on the next worker.
    """
    path = Path(marker)
    if path.exists():
        return 'second run'
    tmp = path.with_suffix('.tmp')
    tmp.write_text(str(os.getpid()))
    tmp.replace(path)
    time.sleep(seconds)
    return 'first run'
