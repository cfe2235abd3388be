"""The files in examples/: parsed, and run against a test server where they can be run."""

from __future__ import annotations

import configparser
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

import rq_epoch
from rq_epoch import Job, Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.pids import children_of, send_signal
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for
from tests.leases import OTHER_EPOCH, start_job

#: The examples do not depend on the server kind: one kind is enough.
pytestmark = pytest.mark.parametrize('server', ['valkey'], indirect=True)

EXAMPLES = ROOT / 'examples'
BIN = Path(sys.executable).parent
#: Where the examples expect the application's virtual environment.
APP_BIN = '/opt/myapp/venv/bin/'
#: rq_epoch.Worker's first log line (``rq-epoch worker`` chose the class).
EPOCH_WORKER_LINE = 'rq-epoch on server epoch'
#: Seconds every example's stop grace keeps above its shutdown timeout: the hand-back is one
#: script call, but the worker may be in the middle of a heartbeat or riding out a short outage.
STOP_MARGIN = 10
#: The shutdown timeout of the examples' stop tests (the examples' own 20 s, scaled down).
TEST_SHUTDOWN_TIMEOUT = '1'


SCRIPTS = {
    'rq': [sys.executable, '-m', 'rq.cli'],
    'rq-epoch': [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()'],
}


def local(argv: list[str]) -> list[str]:
    """An example's command line, with this test run's scripts in place of the app's."""
    name = argv[0].removeprefix(APP_BIN)
    if name not in SCRIPTS:
        return argv
    script = BIN / name
    return ([str(script)] if script.exists() else SCRIPTS[name]) + argv[1:]


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    env['PYTHONPATH'] = os.pathsep.join([str(EXAMPLES), str(ROOT), env.get('PYTHONPATH', '')])
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path = EXAMPLES) -> subprocess.CompletedProcess[str]:
    return subprocess.run(local(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False)


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def systemd_environment(value: str) -> dict[str, str]:
    return dict(item.split('=', 1) for item in shlex.split(value))


def expired_lease(conn: redis.Redis) -> Job:
    job, _ = start_job(conn, Queue('default', connection=conn), epoch=OTHER_EPOCH)
    return job


def test_python_example_enqueues_jobs_with_their_stall_budgets_and_a_worker_runs_them(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    proc = run([sys.executable, 'enqueue.py'], environ(RQ_REDIS_URL=server.url))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[1:] for line in lines] == [
        ['tasks.charge_card', 'max_stalled=1'],
        ['tasks.make_thumbnail', 'max_stalled=5'],
        ['tasks.send_report', 'max_stalled=default'],
    ]
    jobs = [Job.fetch(line.split()[0], connection=conn) for line in lines]
    assert [job.max_stalled for job in jobs] == [1, 5, None]

    # The worker of the systemd unit, in burst mode, runs them.
    service = unit(EXAMPLES / 'systemd' / 'rq-worker@.service')['Service']
    env = systemd_environment(service['Environment'])
    env['RQ_REDIS_URL'] = server.url
    argv = shlex.split(service['ExecStart'].replace('%H', 'examples').replace('%i', '1')) + ['--burst']
    worker = run(argv, environ(**env))
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert EPOCH_WORKER_LINE in worker.stdout
    assert [job.get_status(refresh=True) for job in jobs] == ['finished'] * 3
    assert jobs[0].return_value() == 'charged 4200 cents for order-1001'


def test_crontab_line_runs_the_sweep(server: EmbeddedServer, conn: redis.Redis) -> None:
    lines = [line for line in (EXAMPLES / 'crontab').read_text().splitlines() if line and not line.startswith('#')]
    assignments = dict(line.split('=', 1) for line in lines if re.match(r'^[A-Z_]+=', line))
    entries = [line for line in lines if not re.match(r'^[A-Z_]+=', line)]
    assert list(assignments) == ['RQ_REDIS_URL']
    assert len(entries) == 1
    fields = entries[0].split(None, 5)
    assert fields[:5] == ['*'] * 5
    command = shlex.split(fields[5])
    assert command[1:3] == ['sweep', '--all']

    job = expired_lease(conn)
    proc = run(command + ['--grace', '0'], environ(RQ_REDIS_URL=server.url))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ''  # --quiet: nothing to say without a dead letter
    job.refresh()
    assert job.get_status() == 'queued' and job.exempt_recoveries == 1


def test_systemd_timer_and_service_run_the_sweep(server: EmbeddedServer, conn: redis.Redis) -> None:
    timer = unit(EXAMPLES / 'systemd' / 'rq-epoch-sweep.timer')
    assert timer['Timer']['Unit'] == 'rq-epoch-sweep.service'
    assert timer['Timer']['OnCalendar'] == '*-*-* *:*:00'
    assert timer['Install']['WantedBy'] == 'timers.target'

    service = unit(EXAMPLES / 'systemd' / 'rq-epoch-sweep.service')
    assert service['Service']['Type'] == 'oneshot'
    env = systemd_environment(service['Service']['Environment'])
    assert set(env) == {'RQ_REDIS_URL'}
    job = expired_lease(conn)
    proc = run(shlex.split(service['Service']['ExecStart']) + ['--grace', '0'], environ(RQ_REDIS_URL=server.url))
    assert proc.returncode == 0, proc.stderr
    job.refresh()
    assert job.exempt_recoveries == 1


def shutdown_timeout(env: dict[str, str]) -> int:
    """The shutdown timeout an example's environment gives its workers (as the worker reads it)."""
    value = rq_epoch.EpochSettings.resolve(environ=env).shutdown_timeout
    assert isinstance(value, int), f'a deploy example must bound the wait for the job, got {value!r}'
    return value


def systemd_seconds(value: str) -> int:
    """A systemd time span in whole seconds: ``40``, ``40s``, ``1min 30s``."""
    units = {'': 1, 's': 1, 'sec': 1, 'min': 60, 'm': 60, 'h': 3600}
    parts = re.findall(r'(\d+)\s*([a-z]*)', value.strip())
    assert parts and ''.join(n + u for n, u in parts) == value.replace(' ', ''), value
    return sum(int(n) * units[u] for n, u in parts)


def test_systemd_worker_unit(server: EmbeddedServer) -> None:
    parsed = unit(EXAMPLES / 'systemd' / 'rq-worker@.service')
    service = parsed['Service']
    argv = shlex.split(service['ExecStart'])
    assert argv[:2] == [APP_BIN + 'rq-epoch', 'worker']
    assert service['KillSignal'] == 'SIGTERM' and service['Restart'] == 'always'
    env = systemd_environment(service['Environment'])
    assert rq_epoch.EpochSettings.resolve(environ=env).max_stalled == 3
    assert parsed['Install']['WantedBy'] == 'multi-user.target'
    # The stop: SIGTERM to the worker alone, SIGKILL to what is left only after the hand-back.
    assert service['KillMode'] == 'mixed'
    assert systemd_seconds(service['TimeoutStopSec']) >= shutdown_timeout(env) + STOP_MARGIN
    assert 'finishes its current job' not in (EXAMPLES / 'systemd' / 'rq-worker@.service').read_text()


@pytest.mark.parametrize('name', ['rq-worker@.service', 'rq-epoch-sweep.service', 'rq-epoch-sweep.timer'])
def test_systemd_units_pass_systemd_analyze_verify(server: EmbeddedServer, tmp_path: Path, name: str) -> None:
    """systemd's own check of each unit: every key known, every value parsed. The app's paths are
    replaced by this run's (systemd-analyze checks that the command exists)."""
    analyze = shutil.which('systemd-analyze')
    if analyze is None:
        pytest.skip('systemd-analyze is not installed')
    folder = tmp_path / 'units'
    folder.mkdir()
    for source in (EXAMPLES / 'systemd').iterdir():
        text = source.read_text().replace(APP_BIN + 'rq-epoch', shutil.which('true') or '/bin/true')
        target = source.name.replace('@.', '@1.') if source.name == name else source.name
        (folder / target).write_text(text)
    checked = folder / name.replace('@.', '@1.')
    proc = subprocess.run(
        [analyze, 'verify', '--man=no', str(checked)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if checked.name in line] == [], proc.stderr


def test_supervisor_program_runs_an_epoch_worker(server: EmbeddedServer, conn: redis.Redis) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string((EXAMPLES / 'supervisor' / 'rq-worker.conf').read_text())
    program = parser['program:rq-worker']
    assert program['stopsignal'] == 'TERM'
    assert (program['stopasgroup'], program['killasgroup']) == ('false', 'true')
    assert int(program['numprocs']) >= 1 and '%(process_num)s' in program['process_name']
    env = dict(
        (name, value.strip('"')) for name, value in (item.split('=', 1) for item in program['environment'].split(','))
    )
    assert set(env) == {'RQ_REDIS_URL', 'RQ_EPOCH_MAX_STALLED', 'RQ_EPOCH_SHUTDOWN_TIMEOUT'}
    assert int(program['stopwaitsecs']) >= shutdown_timeout(env) + STOP_MARGIN
    command = program['command'].replace('%(host_node_name)s', 'examples').replace('%(process_num)s', '0')
    argv = shlex.split(command)
    assert argv[:2] == [APP_BIN + 'rq-epoch', 'worker']

    job = Queue('default', connection=conn).enqueue('tasks.send_report', 'daily', max_stalled=2)
    env['RQ_REDIS_URL'] = server.url
    proc = run(argv + ['--burst'], environ(**env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert EPOCH_WORKER_LINE in proc.stdout
    assert job.get_status(refresh=True) == 'finished'


def test_kubernetes_cronjob_runs_the_sweep(server: EmbeddedServer, conn: redis.Redis) -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / 'kubernetes' / 'rq-epoch-sweep-cronjob.yaml').read_text()))
    assert len(docs) == 1
    cron = docs[0]
    assert (cron['apiVersion'], cron['kind']) == ('batch/v1', 'CronJob')
    assert len(cron['spec']['schedule'].split()) == 5
    pod = cron['spec']['jobTemplate']['spec']['template']['spec']
    assert pod['restartPolicy'] == 'Never'
    (container,) = pod['containers']
    assert [e['name'] for e in container['env']] == ['RQ_REDIS_URL']
    command = container['command']
    assert command[:2] == ['rq-epoch', 'sweep']

    job = expired_lease(conn)
    proc = run(command + ['--grace', '0'], environ(RQ_REDIS_URL=server.url))
    assert proc.returncode == 0, proc.stderr
    job.refresh()
    assert job.exempt_recoveries == 1


def test_django_rq_settings_name_rq_epoch_classes(server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('REDIS_URL', server.url)
    settings = runpy.run_path(str(EXAMPLES / 'django' / 'settings_rq.py'))
    from rq.utils import import_attribute

    assert import_attribute(settings['RQ']['WORKER_CLASS']) is rq_epoch.Worker
    assert import_attribute(settings['RQ']['JOB_CLASS']) is rq_epoch.Job
    for queue in settings['RQ_QUEUES'].values():
        client = redis.Redis.from_url(queue['URL'])
        assert client.ping()
        client.close()


def test_kubernetes_worker_deployment_outlasts_the_shutdown_timeout(server: EmbeddedServer, conn: redis.Redis) -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / 'kubernetes' / 'rq-worker-deployment.yaml').read_text()))
    assert len(docs) == 1
    deployment = docs[0]
    assert (deployment['apiVersion'], deployment['kind']) == ('apps/v1', 'Deployment')
    spec = deployment['spec']
    labels = spec['template']['metadata']['labels']
    assert spec['selector']['matchLabels'].items() <= labels.items()
    assert spec['strategy']['type'] == 'RollingUpdate'
    pod = spec['template']['spec']
    (container,) = pod['containers']
    env = {e['name']: e.get('value') for e in container['env']}
    assert set(env) == {'RQ_REDIS_URL', 'RQ_EPOCH_SHUTDOWN_TIMEOUT'}
    timeout = shutdown_timeout({'RQ_EPOCH_SHUTDOWN_TIMEOUT': env['RQ_EPOCH_SHUTDOWN_TIMEOUT']})
    assert timeout < 30  # also under Kubernetes' default grace, should the field be dropped
    assert pod['terminationGracePeriodSeconds'] >= timeout + STOP_MARGIN
    command = container['command']
    assert isinstance(command, list) and command[:2] == ['rq-epoch', 'worker']  # exec form: the worker gets SIGTERM

    job = Queue('default', connection=conn).enqueue('tasks.send_report', 'weekly')
    proc = run(command + ['--burst'], environ(RQ_REDIS_URL=server.url, RQ_EPOCH_SHUTDOWN_TIMEOUT=str(timeout)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert EPOCH_WORKER_LINE in proc.stdout
    assert job.get_status(refresh=True) == 'finished'


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, comments and blank lines left out."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith('#'):
            instruction, _, rest = line.strip().partition(' ')
            rows.append((instruction.upper(), rest.strip()))
    return rows


def test_dockerfile_stops_the_worker_with_sigterm_and_a_long_enough_docker_stop(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    path = EXAMPLES / 'docker' / 'Dockerfile'
    rows = dockerfile(path)
    assert ('STOPSIGNAL', 'SIGTERM') in rows
    env = dict(arg.split('=', 1) for instruction, arg in rows if instruction == 'ENV')
    timeout = shutdown_timeout(env)
    (cmd,) = [arg for instruction, arg in rows if instruction == 'CMD']
    command = json.loads(cmd)  # exec form: no shell between docker and the worker
    assert command[:2] == ['rq-epoch', 'worker']
    text = path.read_text()
    (stop,) = re.findall(r'docker stop -t (\d+)', text)
    (compose,) = re.findall(r'stop_grace_period: (\d+)s', text)
    (ecs,) = re.findall(r'stopTimeout (\d+)', text)
    assert int(stop) == int(compose) == int(ecs) >= timeout + STOP_MARGIN

    job = Queue('default', connection=conn).enqueue('tasks.make_thumbnail', 'cat.png')
    proc = run(command + ['--burst'], environ(RQ_REDIS_URL=server.url, **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert EPOCH_WORKER_LINE in proc.stdout
    assert job.get_status(refresh=True) == 'finished'


#: Seconds Heroku waits after its SIGTERM to every process of a dyno before SIGKILL (not settable).
HEROKU_GRACE = 30


def procfile_worker() -> tuple[dict[str, str], list[str]]:
    """The ``worker`` process type of the Heroku Procfile: its variables and its command line."""
    lines = [line for line in (EXAMPLES / 'heroku' / 'Procfile').read_text().splitlines() if line.strip()]
    types = dict(line.split(':', 1) for line in lines)
    assert list(types) == ['worker']
    words = shlex.split(types['worker'])
    env = {}
    while re.match(r'^[A-Z_]+=', words[0]):
        name, value = words.pop(0).split('=', 1)
        env[name] = value
    return env, words


def started_job(conn: redis.Redis, ledger: Path, release: Path) -> Job:
    """A job that runs until ``release`` exists (bounded), enqueued on ``default``."""
    return Queue('default', connection=conn).enqueue(
        'tests.jobs.wait_for_file_then_record', str(ledger), 'deploy', str(release), 60
    )


def start_example_worker(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """An example's worker command, run as its supervisor would run it, with short test settings."""
    settings = {
        'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
        'RQ_EPOCH_LEASE_MARGIN': '2',
        'RQ_EPOCH_SWEEP_INTERVAL': '1',
        'PYTHONUNBUFFERED': '1',
    }
    with open(log, 'wb') as fh:
        return subprocess.Popen(
            local(argv), stdout=fh, stderr=subprocess.STDOUT, cwd=EXAMPLES, env=environ(**{**env, **settings})
        )


def assert_handed_back(conn: redis.Redis, job: Job, proc: subprocess.Popen[bytes], log: Path, grace: int) -> None:
    """The worker exits 0 well within ``grace`` and the job waits, uncounted, at the front of its queue."""
    try:
        code = proc.wait(grace)
    except subprocess.TimeoutExpired:
        pytest.fail(f'the worker outlived the grace of {grace} s:\n{log.read_text(errors="replace")}')
    assert code == 0, log.read_text(errors='replace')
    job.refresh()
    assert job.get_status() == 'queued', log.read_text(errors='replace')
    assert job.stalled == 0
    assert conn.lindex(Queue('default', connection=conn).key, 0) == job.id.encode()
    assert int(conn.hget(keys.stats_key('default'), 'handed_back') or 0) == 1


def test_heroku_procfile_worker_hands_its_job_back_when_the_dyno_stops(
    server: EmbeddedServer, conn: redis.Redis, tmp_path: Path
) -> None:
    """Heroku's stop, scaled down: SIGTERM to every process of the dyno at once; the job is
    handed back within the grace (the Procfile's shutdown timeout is under Heroku's 30 s)."""
    env, argv = procfile_worker()
    assert argv[:2] == ['rq', 'worker']
    assert argv[argv.index('--worker-class') + 1] == 'rq_epoch.HerokuWorker'
    assert shutdown_timeout(env) + STOP_MARGIN <= HEROKU_GRACE
    argv = [os.path.expandvars(word.replace('$REDIS_URL', server.url)) for word in argv]

    ledger, release = tmp_path / 'ledger', tmp_path / 'release'
    job = started_job(conn, ledger, release)
    log = tmp_path / 'worker.log'
    proc = start_example_worker(argv, {**env, 'RQ_EPOCH_SHUTDOWN_TIMEOUT': TEST_SHUTDOWN_TIMEOUT}, log)
    try:
        wait_for(lambda: ledger.exists(), 60, what='the job to start')
        horses = children_of(proc.pid)
        assert horses, 'the job runs in a work-horse'
        for pid in [proc.pid, *horses]:  # the whole dyno at once
            send_signal(pid, signal.SIGTERM)
        assert_handed_back(conn, job, proc, log, HEROKU_GRACE)
        assert 'end deploy' not in ledger.read_text()
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_systemd_worker_unit_hands_its_job_back_on_systemctl_stop(
    server: EmbeddedServer, conn: redis.Redis, tmp_path: Path
) -> None:
    """systemd's stop with the unit's KillMode=mixed, scaled down: SIGTERM to the worker alone,
    SIGKILL to what is left only after TimeoutStopSec; the worker hands back before that."""
    service = unit(EXAMPLES / 'systemd' / 'rq-worker@.service')['Service']
    env = systemd_environment(service['Environment'])
    env.update(RQ_REDIS_URL=server.url, RQ_EPOCH_SHUTDOWN_TIMEOUT=TEST_SHUTDOWN_TIMEOUT)
    argv = shlex.split(service['ExecStart'].replace('%H', 'examples').replace('%i', '1'))
    grace = systemd_seconds(service['TimeoutStopSec'])

    ledger, release = tmp_path / 'ledger', tmp_path / 'release'
    job = started_job(conn, ledger, release)
    log = tmp_path / 'worker.log'
    proc = start_example_worker(argv, env, log)
    try:
        wait_for(lambda: ledger.exists(), 60, what='the job to start')
        horses = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert_handed_back(conn, job, proc, log, grace)
        assert not [pid for pid in horses if send_signal(pid, 0)], 'the worker ended its work-horse'
        assert 'end deploy' not in ledger.read_text()
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
