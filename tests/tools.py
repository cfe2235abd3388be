"""System programs some tests need (promtool, prometheus, chromium): a skip on a developer's
machine without them, a failure in CI (``CI`` set), where ``.ci/run`` installs them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: Where each program may be found, first match wins; an environment variable names another one.
PROGRAMS = {
    'promtool': ('PROMTOOL', ('promtool',)),
    'prometheus': ('PROMETHEUS', ('prometheus',)),
    'chromium': ('CHROMIUM', ('chromium', 'chromium-browser')),
}


def system_tool(name: str) -> str:
    """The path of program ``name``; skips the test when it is missing, fails it in CI."""
    env, candidates = PROGRAMS[name]
    given = os.environ.get(env)
    found = given if given and Path(given).exists() else None
    for candidate in () if found else candidates:
        found = shutil.which(candidate)
        if found:
            break
    if found:
        return found
    message = (
        f'{name} is not installed (Debian package {"prometheus" if name != "chromium" else "chromium"}; or set {env})'
    )
    if os.environ.get('CI'):
        pytest.fail(f'CI must run this test: {message}; .ci/run installs it')
    pytest.skip(message)
