"""The runner of RQ's own test suite (``tests/rq_suite/run.py``) survives RQ's tests' signals.

RQ's ``HerokuWorker`` test of the warm shutdown can send SIGRTMIN to the process group it
shares with pytest (when its forked child has not yet moved to a group of its own). Once,
that ended pytest, ``run.py`` and ``.ci/run`` with it. Here a test does that on purpose.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not hasattr(signal, 'SIGRTMIN'), reason='needs SIGRTMIN (Linux)')

#: A test that signals its own process group, as RQ's test does when its child is late.
SIGNALLING_TEST = """
import multiprocessing
import os
import signal
import time


def _wait(ready):
    ready.set()
    time.sleep(120)  # longer than every signal below can take: only the signal ends it


def test_signal_to_the_runners_group():
    fork = multiprocessing.get_context('fork')
    ready = fork.Event()
    child = fork.Process(target=_wait, args=(ready,))
    child.start()
    assert ready.wait(60)  # running its own code, as RQ's child is 0.1 s after the fork
    assert os.getpgid(child.pid) == os.getpgrp()  # the child shares pytest's group
    # The group is signalled again while the child lives (at most three times in 90 s): on a
    # machine this loaded, a child can be slow to run its handler; pytest must outlive each.
    try:
        for sent in range(1, 4):
            os.killpg(os.getpgid(child.pid), signal.SIGRTMIN)
            child.join(30)
            if child.exitcode is not None:
                break
        assert child.exitcode == -signal.SIGRTMIN, (child.exitcode, sent)  # it dies of it, as by default
    finally:
        if child.is_alive():
            child.kill()
"""

#: Calls run.py's run_pytest on the test above and prints the outcomes as JSON.
DRIVER = """
import json
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from run import run_pytest

results, output = run_pytest(Path(sys.argv[2]), 6379, False, ['test_signalling.py'], Path(sys.argv[2]) / 'report.xml')
print(output)
print(json.dumps(results))
"""


def test_a_signal_rq_tests_send_to_pytests_group_ends_neither_pytest_nor_the_runner(tmp_path: Path) -> None:
    (tmp_path / 'test_signalling.py').write_text(SIGNALLING_TEST)
    # The driver runs in a session of its own, so that if run.py shared pytest's group the
    # signal would end the driver, not this test's process.
    proc = subprocess.run(
        [sys.executable, '-c', DRIVER, str(ROOT / 'tests' / 'rq_suite'), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # the test above waits at most 60 + 3 × 30 s
        start_new_session=True,
    )
    assert proc.returncode == 0, f'the driver ended with {proc.returncode}\n{proc.stdout}\n{proc.stderr}'
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(name.rsplit('::', 1)[-1], outcome) for name, outcome in results.items()] == [
        ('test_signal_to_the_runners_group', 'passed')
    ], proc.stdout
