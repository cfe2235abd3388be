"""The files in examples/: parsed, and run against a test server where they can be run."""

from __future__ import annotations

import configparser
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

import rq_epoch
from rq_epoch import Job, Queue
from rq_epoch.embedded import EmbeddedServer
from tests.conftest import ROOT
from tests.leases import OTHER_EPOCH, start_job

#: The examples do not depend on the server kind: one kind is enough.
pytestmark = pytest.mark.parametrize('server', ['valkey'], indirect=True)

EXAMPLES = ROOT / 'examples'
BIN = Path(sys.executable).parent
#: Where the examples expect the application's virtual environment.
APP_BIN = '/opt/myapp/venv/bin/'
#: rq_epoch.Worker's first log line (``rq-epoch worker`` chose the class).
EPOCH_WORKER_LINE = 'rq-epoch on server epoch'


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


def test_systemd_worker_unit(server: EmbeddedServer) -> None:
    parsed = unit(EXAMPLES / 'systemd' / 'rq-worker@.service')
    service = parsed['Service']
    argv = shlex.split(service['ExecStart'])
    assert argv[:2] == [APP_BIN + 'rq-epoch', 'worker']
    assert service['KillSignal'] == 'SIGTERM' and service['Restart'] == 'always'
    env = systemd_environment(service['Environment'])
    assert rq_epoch.EpochSettings.resolve(environ=env).max_stalled == 3
    assert parsed['Install']['WantedBy'] == 'multi-user.target'


def test_supervisor_program_runs_an_epoch_worker(server: EmbeddedServer, conn: redis.Redis) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string((EXAMPLES / 'supervisor' / 'rq-worker.conf').read_text())
    program = parser['program:rq-worker']
    assert program['stopsignal'] == 'TERM'
    assert int(program['numprocs']) >= 1 and '%(process_num)s' in program['process_name']
    env = dict(
        (name, value.strip('"')) for name, value in (item.split('=', 1) for item in program['environment'].split(','))
    )
    assert set(env) == {'RQ_REDIS_URL', 'RQ_EPOCH_MAX_STALLED'}
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
