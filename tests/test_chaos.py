"""The chaos run in CI: a small deterministic configuration that asserts rq-epoch's invariants.

The run itself (``python -m benchmarks.chaos``) starts its own Valkey server with
``appendfsync always``, real ``rq worker --worker-class rq_epoch.Worker`` processes on three
queues each (so every job is taken by the take script) and a cron-like sweeper process,
and injects two server restarts (one SHUTDOWN, one ``kill -9``),
one SIGKILL of a busy worker and its horse, one freeze (SIGSTOP longer than the lease, then
SIGCONT) and one poison pill. It runs on Valkey only, once per RQ version: the restart and
recovery paths it drives are covered on both servers by the other end-to-end tests, and
the suite has to stay short on two cores. Only the rq-epoch side runs here: stock RQ's
60 s lease extra would add minutes, and the invariants are rq-epoch's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.chaos import Attempt, Config, JobAudit, check_invariants, explain, in_order_of_start, make_plan
from benchmarks.chaos.audit import held_faults, read_takes
from tests.conftest import ROOT

SMALL = [
    '--jobs', '36', '--pills', '1', '--workers', '3', '--restarts', '2', '--kills', '1', '--freezes', '1',
    '--duration', '24', '--seed', '7', '--max-stalled', '2', '--max-seconds', '1.5', '--sides', 'rq-epoch',
    '--server', 'valkey', '--queues', '3', '--lease-margin', '4',
]  # fmt: skip
# A lease of 5 s (heartbeat 1 s + margin 4 s): with the suite's eight test processes on two
# cores, a worker was once descheduled past a 3 s lease with no fault applied, and the sweep
# rightly counted the stall that the audit then found no fault for.


SENTINEL_SMALL = [
    '--topology', 'sentinel', '--min-replicas', '1', '--restarts', '0', '--failovers', '2', '--primary-freezes', '1',
    '--jobs', '40', '--pills', '1', '--workers', '3', '--kills', '1', '--freezes', '0', '--duration', '40',
    '--seed', '7', '--max-stalled', '2', '--max-seconds', '1.5', '--sides', 'rq-epoch', '--server', 'valkey',
]  # fmt: skip


def small_config() -> Config:
    """The configuration of :data:`SMALL`."""
    return Config(
        jobs=36, pills=1, workers=3, restarts=2, kills=1, freezes=1, duration=24, seed=7, max_stalled=2,
        max_seconds=1.5, sides=('rq-epoch',), queues=3, lease_margin=4,
    )  # fmt: skip


def test_plan_is_drawn_from_the_seed_alone() -> None:
    """Same seed, same workload and schedule; the schedule has what the issue asks for."""
    cfg = small_config()
    plan = make_plan(cfg)
    assert plan == make_plan(cfg)
    assert plan != make_plan(replace(cfg, seed=8))
    kinds = sorted(f.kind for f in plan.faults)
    assert kinds == ['crash', 'freeze', 'kill', 'restart']
    assert all(f.hold > cfg.lease('rq-epoch') for f in plan.faults if f.kind == 'freeze')
    jobs = plan.by_id()
    assert sum(1 for j in plan.jobs if j.kind == 'pill') == 1
    assert any(j.parent == 'p00' for j in plan.jobs)  # the pill has an allow_failure dependent
    for job in plan.jobs:
        if job.parent:
            assert jobs[job.parent].at <= job.at


def test_sentinel_faults_are_drawn_after_the_others() -> None:
    """Failovers and frozen primaries join the schedule without changing the rest of the plan."""
    cfg = small_config()
    with_topology = replace(cfg, restarts=0, failovers=2, primary_freezes=1)
    plan = make_plan(with_topology)
    assert plan == make_plan(with_topology)
    assert sorted(f.kind for f in plan.faults) == ['failover', 'failover', 'freeze', 'kill', 'primary-freeze']
    assert plan.jobs == make_plan(replace(cfg, restarts=0)).jobs
    others = [f for f in plan.faults if f.kind in ('kill', 'freeze')]
    assert others == [f for f in make_plan(replace(cfg, restarts=0)).faults]
    assert [f.hold for f in plan.faults if f.kind == 'primary-freeze'] == [with_topology.primary_freeze_for]


def test_the_audit_attributes_reruns_and_flags_violations() -> None:
    """The audit names the fault behind each rerun, and each invariant can fail."""
    events = [
        {'kind': 'kill', 't': 100.0, 'pid': 7},
        {'kind': 'freeze', 't': 200.0, 'pid': 8},
        {'kind': 'server-down', 't': 300.0},
        {'kind': 'server-up', 't': 302.0},
    ]
    assert explain(Attempt(1, 70, 7, 99.0), 104.0, False, events) == 'kill'
    assert explain(Attempt(1, 80, 8, 199.0, 209.0), 205.0, False, events) == 'freeze'
    assert explain(Attempt(1, 90, 9, 299.0), 310.0, False, events) == 'restart'
    assert explain(Attempt(1, 90, 9, 400.0, 401.0), 410.0, False, events) == 'unexplained'
    assert explain(Attempt(1, 90, 9, 400.0, 401.0), 400.5, False, events) == 'ran twice at once'
    # An execution cut short around a failover, or a frozen primary, without a fault on its worker.
    failover = events + [{'kind': 'failover', 't': 600.0}, {'kind': 'promoted', 't': 601.0}]
    assert explain(Attempt(1, 90, 9, 598.0, 603.0), 620.0, False, failover) == 'failover'
    assert explain(Attempt(1, 90, 9, 650.0, 651.0), 660.0, False, failover) == 'unexplained'
    assert explain(Attempt(1, 90, 9, 601.0, 602.0), 601.5, False, failover) == 'failover'  # taken from the old one
    frozen = events + [
        {'kind': 'primary-freeze', 't': 700.0},
        {'kind': 'promoted', 't': 703.0},
        {'kind': 'primary-thaw', 't': 708.0},
    ]
    assert explain(Attempt(1, 90, 9, 718.0, 719.0), 730.0, False, frozen) == 'failover'  # 10 s after the thaw
    # The horse signalled decides, and the earliest fault wins: frozen at 500, its worker killed later.
    later = events + [{'kind': 'freeze', 't': 500.0, 'pid': 5, 'horses': [50]}, {'kind': 'kill', 't': 560.0, 'pid': 5}]
    assert explain(Attempt(1, 50, 5, 499.0, 566.0), 504.0, False, later) == 'freeze'
    cfg = small_config()
    one = [Attempt(1, 1, 2, 1.0)]
    healthy_failed = JobAudit('h1', 'healthy', 'failed', 'failed', one, 0, 0, 0, 0, 1, 'x', 'failed')
    rerun = JobAudit(
        'h2', 'healthy', 'finished', 'finished', [Attempt(1, 1, 2, 1.0, reason='restart'), Attempt(2, 3, 4, 5.0)],
        0, 1, 0, 0, 1, '', 'finished',
    )  # fmt: skip
    pill = JobAudit('p1', 'pill', 'failed', 'failed', [Attempt(1, 1, 2, 1.0)] * 2, 1, 1, 0, 0, 1, '', 'failed')
    retried = JobAudit('h3', 'healthy', 'finished', 'finished', one, 0, 0, 0, 1, 2, '', 'finished')
    stale = JobAudit('h4', 'healthy', 'finished', 'finished', one, 0, 0, 0, 0, 2, '', 'finished', worker_results=2)
    found = check_invariants([healthy_failed, rerun, pill, retried, stale], cfg)
    assert 'h4: 1 outcome(s) of a superseded execution landed' in found
    assert any(v.startswith('h3: healthy job failed 1 time(s) and was retried') for v in found)
    assert any(v.startswith('h1: healthy job failed') for v in found)
    assert any(v.startswith('h2: ran again') for v in found)
    assert any(v.startswith('h2: 1 counted stall') for v in found)
    assert any(v.startswith('p1: poison pill dead after 1 counted stalls') for v in found)
    # Under Sentinel without a write quorum, a write lost in a failover may rerun a job, uncounted only.
    moved = JobAudit(
        'h4', 'healthy', 'finished', 'finished', [Attempt(1, 1, 2, 1.0, reason='failover'), Attempt(2, 3, 4, 5.0)],
        0, 0, 1, 0, 1, '', 'finished',
    )  # fmt: skip
    counted = replace(moved, id='h5', stalled=1)
    lenient = replace(cfg, topology='sentinel', restarts=0, failovers=1)
    assert [v.split(':')[0] for v in check_invariants([moved, counted], lenient)] == ['h5']
    strict = replace(lenient, min_replicas=1)
    assert sorted(v.split(':')[0] for v in check_invariants([moved, counted], strict)) == ['h4', 'h5', 'h5']


def test_a_horse_frozen_before_its_job_function_ran_counts_from_the_freeze() -> None:
    """Its ledger line comes after the thaw, possibly after another execution of the job: the
    audit orders it by the freeze, and the freeze explains the stall the sweep counted."""
    events = [{'kind': 'freeze', 't': 51.0, 'pid': 14, 'horses': [90]}, {'kind': 'thaw', 't': 59.0, 'pid': 14}]
    other = Attempt(1, 11, 10, 54.0, 54.2)  # took over after the counted stall, finished
    zombie = Attempt(2, 90, 14, 58.9)  # forked at 50.5, frozen at 51, its job function logged at 58.9
    ordered = in_order_of_start([other, zombie], events)
    assert ordered == [zombie, other]
    assert explain(zombie, other.start, False, events) == 'freeze'
    assert in_order_of_start([other, replace(zombie, pid=91)], events)[0] is other  # another horse frozen: no change


def test_a_worker_killed_after_taking_a_job_it_never_began_accounts_for_the_counted_stall(tmp_path: Path) -> None:
    took = time.mktime((2026, 12, 3, 18, 56, 19, 0, 0, -1))  # local time, as the worker logs it
    events = [
        {'kind': 'worker-start', 'pid': 101, 'log': 'worker-1-1.log', 't': took - 10},
        {'kind': 'worker-start', 'pid': 102, 'log': 'worker-2-1.log', 't': took - 10},
        {'kind': 'worker-start', 'pid': 103, 'log': 'worker-0-1.log', 't': took - 10},
        {'kind': 'kill', 'pid': 101, 'horses': [201], 't': took + 0.1},
        {'kind': 'freeze', 'pid': 103, 'horses': [], 't': took - 5},
    ]
    (tmp_path / 'worker-1-1.log').write_text("18:56:19 Worker w1: chaos: jobs.work('h1', 0.1) (h1)\n")
    (tmp_path / 'worker-2-1.log').write_text(
        "18:56:24 Worker w2: chaos: jobs.work('h1', 0.1) (h1)\n18:56:24 Worker w2: chaos: Job OK (h1)\n"
    )
    # a sweep's line names the job too, but the sweeping worker never held it
    (tmp_path / 'worker-0-1.log').write_text('18:56:24 sweep: job h1 queue chaos verdict recovered stalled 1/2\n')
    takes = read_takes(tmp_path, events)
    assert sorted({pid for pid, _ in takes['h1']}) == [101, 102]
    ran = [Attempt(1, 202, 102, took + 5, took + 5.2)]
    assert held_faults(ran, takes['h1'], events) == 1
    # The audit puts such a fault in the band of the truth (the job may not have started).
    job = JobAudit(
        'h1', 'healthy', 'finished', 'finished', ran, 0, 1, 0, 0, 1, '', 'finished', held_faults=1, deaths_band=1
    )
    assert check_invariants([job], Config()) == []
    assert check_invariants([replace(job, held_faults=0, deaths_band=0)], Config()) == [
        'h1: 1 counted stall(s) but only 0 kill/freeze of its workers'
    ]
    # a fault before the worker took the job does not count
    (tmp_path / 'worker-1-1.log').write_text("18:56:21 Worker w1: chaos: jobs.work('h1', 0.1) (h1)\n")
    assert held_faults(ran, read_takes(tmp_path, events)['h1'], events) == 0


@pytest.mark.slow
@pytest.mark.parametrize('worker_class', ['Worker', 'SpawnWorker'])
def test_small_chaos_run_keeps_every_rq_epoch_invariant(tmp_path: Path, worker_class: str) -> None:
    """Two restarts, a kill, a freeze and a poison pill: every invariant holds, nothing is left behind.

    With forked work-horses, and with spawned ones (their own process: they connect and read
    the worker and the job themselves, where a restart or a freeze can meet them)."""
    out = tmp_path / 'chaos.json'
    argv = [
        sys.executable, '-m', 'benchmarks.chaos', *SMALL, '--worker-class', worker_class,
        '--json', str(out), '--workdir', str(tmp_path / 'w'),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the harness ends its workers, sweeper and server on SIGTERM
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f'the chaos run took more than 240 s:\n{output}') from None
    print(output)
    assert proc.returncode == 0, output
    side = json.loads(out.read_text())['sides']['rq-epoch']
    row = side['row']
    assert side['violations'] == []
    assert (row['restarts'], row['restarts_crash'], row['kills'], row['freezes']) == (2, 1, 1, 1)
    hits = [e for e in side['events'] if e['kind'] in ('kill', 'freeze')]
    assert all(e['horses'] for e in hits), hits  # both hit a worker that was running a job
    assert (row['lost'], row['stuck'], row['healthy_failed']) == (0, 0, 0)
    assert row['healthy_finished'] == row['healthy'] == 36
    assert (row['pills_dead'], row['pill_stalls']) == (1, [2])
    assert row['callbacks_run'] == 1  # the pill's on_failure, once; no healthy job failed
    assert row['retries_spent'] == 0
    assert row['stale_outcomes_landed'] == 0
    assert set(row['superseded_executions']) <= {'kill', 'freeze'}
    assert not list((tmp_path / 'w').glob('*/data')), 'the run removes its folders'
    assert json.loads(out.read_text())['config']['queues'] == 3


@pytest.mark.slow
def test_small_sentinel_chaos_run_keeps_every_rq_epoch_invariant(tmp_path: Path) -> None:
    """Two manual failovers, a frozen primary, a kill and a poison pill under Sentinel: every invariant holds.

    With ``min-replicas-to-write 1`` and one replica, the old primary takes no write once the
    replica left it, so no acknowledged write can be lost in a failover: no job may run twice
    but for the kill (without it, see ``check_invariants``).
    """
    out = tmp_path / 'chaos.json'
    argv = [
        sys.executable, '-m', 'benchmarks.chaos', *SENTINEL_SMALL, '--json', str(out), '--workdir', str(tmp_path / 'w'),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f'the chaos run took more than 240 s:\n{output}') from None
    print(output)
    assert proc.returncode == 0, output
    side = json.loads(out.read_text())['sides']['rq-epoch']
    row = side['row']
    assert side['violations'] == []
    assert (row['failovers'], row['primary_freezes'], row['kills']) == (2, 1, 1)
    assert len([e for e in side['events'] if e['kind'] == 'promoted']) == 3
    assert (row['lost'], row['stuck'], row['healthy_failed'], row['retries_spent']) == (0, 0, 0, 0)
    assert row['healthy_finished'] == row['healthy'] == 40
    assert (row['pills_dead'], row['pill_stalls']) == (1, [2])
    assert set(row['superseded_executions']) <= {'kill'}
    assert not list((tmp_path / 'w').glob('*/topology')), 'the run removes its folders'


def test_the_truth_of_each_death_counts_a_lease_that_ran_out_before_the_restart() -> None:
    """A death counts when its lease (3 s past the last heartbeat) ran out a sweep interval
    before the next restart or failover; not when the boundary came a sweep interval before
    the earliest deadline; in between it is in the band, reported apart."""
    from benchmarks.chaos.audit import judge_death, judge_deaths

    cfg = replace(small_config(), lease_margin=2)  # heartbeat 1 s, lease 3 s, sweeps every 1 s
    events = [
        {'kind': 'server-down', 't': 100.0},
        {'kind': 'server-up', 't': 102.0},
        {'kind': 'failover', 't': 200.0},
        {'kind': 'promoted', 't': 201.0},
    ]
    assert judge_death(90.0, cfg, events) == 'count'  # deadline by 93, restart at 100
    assert judge_death(95.9, cfg, events) == 'count'  # deadline by 98.9: noted before 100
    assert judge_death(96.5, cfg, events) == 'band'  # deadline by 99.5: the note may not come in time
    assert judge_death(98.5, cfg, events) == 'band'  # deadline from 100.5 on
    assert judge_death(99.5, cfg, events) == 'exempt'  # deadline from 101.5 on: the restart came first
    assert judge_death(101.0, cfg, events) == 'exempt'  # died while the server was down
    assert judge_death(102.5, cfg, events) == 'band'  # back up: no heartbeat may have re-stamped it yet
    assert judge_death(104.5, cfg, events) == 'count'  # two heartbeats after it came back
    restarted = [{'kind': 'server-down', 't': 100.0}, {'kind': 'server-up', 't': 102.0, 'started': 101.6}]
    assert judge_death(101.0, cfg, restarted) == 'exempt'  # not started again yet
    assert judge_death(101.8, cfg, restarted) == 'band'  # started: it may have answered already
    assert judge_death(150.0, cfg, events) == 'count'
    assert judge_death(200.5, cfg, events) == 'band'  # during the failover
    assert judge_death(199.8, cfg, events) == 'band'  # the last heartbeat may have crossed it
    assert judge_death(198.5, cfg, events) == 'band'  # deadline from 200.5 on, before the promotion seen
    assert judge_death(210.0, cfg, events) == 'band'  # workers may still write to the demoted primary
    assert judge_death(219.0, cfg, events) == 'count'  # past that tail and two heartbeats
    assert judge_death(300.0, cfg, events) == 'count'  # no boundary after it
    frozen = [{'kind': 'primary-freeze', 't': 50.0}, {'kind': 'promoted', 't': 53.0}]
    assert judge_death(45.0, cfg, frozen) == 'count'
    assert judge_death(48.5, cfg, frozen) == 'band'
    pill = Attempt(1, 10, 11, 90.0, reason='poison pill')
    killed = Attempt(2, 12, 13, 97.0, reason='kill')
    cut = Attempt(3, 14, 15, 99.0, reason='restart')  # not a death
    kill = {'kind': 'kill', 't': 99.5, 'pid': 13, 'horses': [12]}
    assert judge_deaths([pill, killed, cut], [150.0], cfg, [*events, kill]) == (1, 1, 1)
    # Counted beyond the truth and its band is a violation; uncounted is reported.
    base = JobAudit('h1', 'healthy', 'finished', 'finished', [], 0, 1, 0, 0, 1, '', 'finished', deaths_count=1)
    assert base.deaths_counted_wrongly == 0 and base.deaths_uncounted == 0
    # Two kills, one of them just before a restart: two counted stalls are one too many.
    wrong = replace(base, stalled=2, deaths_exempt=1, attempts=[killed, replace(killed, n=3), Attempt(4, 1, 2, 150.0)])
    assert wrong.deaths_counted_wrongly == 1
    assert any('but only 1 death(s) that should count' in v for v in check_invariants([wrong], cfg))
    assert replace(base, stalled=0).deaths_uncounted == 1
    pill_job = JobAudit(
        'p1', 'pill', 'failed', 'failed', [Attempt(i, i, i, float(i), reason='poison pill') for i in range(3)],
        0, 2, 1, 0, 1, '', 'failed', deaths_count=3,
    )  # fmt: skip
    assert any('though every death should have counted' in v for v in check_invariants([pill_job], cfg))
    assert not check_invariants([replace(pill_job, deaths_count=2, deaths_exempt=1)], cfg)


def test_stalls_counted_by_a_later_process_are_found_in_the_logs(tmp_path: Path) -> None:
    from benchmarks.chaos.audit import counted_by_a_later_process

    a, b = 'a' * 40, 'b' * 40
    (tmp_path / 'worker-0-1.log').write_text(
        f'12:00:01 sweep: job j1 queue q verdict recovered stalled 1/3 lease_epoch {a} run_id {b}\n'
        f'12:00:02 sweep: job j2 queue q verdict recovered stalled 1/3 lease_epoch {b} run_id {b}\n'
        f'12:00:03 sweep: job j3 queue q verdict exempt stalled 0/3 lease_epoch {a} run_id {b}\n'
    )
    (tmp_path / 'sweeper.jsonl').write_text(
        json.dumps({'job_id': 'j1', 'verdict': 'recovered', 'stalled': 1, 'lease_epoch': a, 'run_id': b}) + '\n'
        + json.dumps({'job_id': 'j4', 'verdict': 'dead', 'stalled': 3, 'lease_epoch': a, 'run_id': b}) + '\n'
    )  # fmt: skip
    assert counted_by_a_later_process(tmp_path) == 2  # j1 once, j4


def test_rolling_deploys_are_drawn_last_one_stop_per_worker() -> None:
    """A plan with deploys keeps every other draw; each deploy stops every worker slot in turn, with
    a stop sequence each, and graces on both sides of the shutdown timeout."""
    from benchmarks.chaos.plan import STOP_SEQUENCES

    cfg = replace(small_config(), deploys=4, shutdown_timeout=3)
    plan = make_plan(cfg)
    assert plan == make_plan(cfg)
    without = make_plan(replace(cfg, deploys=0))
    assert plan.jobs == without.jobs
    assert [f for f in plan.faults if f.kind != 'deploy'] == list(without.faults)
    deploys = [f for f in plan.faults if f.kind == 'deploy']
    assert len(deploys) == 4 and all(len(f.steps) == cfg.workers for f in deploys)
    steps = [step for f in deploys for step in f.steps]
    assert {sequence for sequence, _ in steps} <= set(STOP_SEQUENCES)
    graces = [grace for _, grace in steps]
    assert min(graces) < cfg.shutdown_timeout < max(graces)
    assert '--deploys 4' in cfg.command()


def test_the_audit_names_a_deploy_that_stopped_an_execution_and_its_counted_stalls() -> None:
    events = [
        {'kind': 'deploy-stop', 't': 100.0, 'pid': 7, 'horses': [70], 'sequence': 'k8s'},
        {'kind': 'kill', 't': 200.0, 'pid': 8, 'horses': [80]},
    ]
    assert explain(Attempt(1, 70, 7, 99.0), 105.0, False, events) == 'deploy'
    assert explain(Attempt(1, 80, 8, 199.0), 205.0, False, events) == 'kill'
    handed_back = [Attempt(1, 70, 7, 99.0, reason='deploy'), Attempt(2, 90, 9, 105.0, 106.0)]
    job = JobAudit('h1', 'healthy', 'finished', 'finished', handed_back, 0, 0, 0, 0, 1, '', 'finished')
    assert job.deploy_stalls == 0 and check_invariants([job], small_config()) == []
    counted = replace(job, stalled=1)
    assert counted.deploy_stalls == 1
    found = check_invariants([counted], small_config())
    assert found == ['h1: 1 counted stall(s) but only 0 kill/freeze of its workers']
    killed_too = replace(counted, attempts=[Attempt(1, 80, 8, 199.0, reason='kill'), *handed_back])
    assert killed_too.deploy_stalls == 0


DEPLOY_SMALL = [
    '--jobs', '15', '--pills', '1', '--workers', '3', '--restarts', '1', '--kills', '1', '--freezes', '0',
    '--duration', '30', '--seed', '7', '--max-stalled', '2', '--min-seconds', '6', '--max-seconds', '10',
    '--sides', 'rq-epoch', '--server', 'valkey', '--lease-margin', '4', '--deploys', '2', '--shutdown-timeout', '2',
]  # fmt: skip
# Jobs of 6 to 10 s and a 2 s shutdown timeout: a stop that meets a job leaves it at least 2 s to
# run two times in three, so the run's six stops cut some jobs short (hand-backs, stopping verdicts).


@pytest.mark.slow
def test_small_chaos_run_with_rolling_deploys_costs_no_job_anything(tmp_path: Path) -> None:
    """Two rolling deploys (every worker stopped in turn, each with its own stop sequence and grace)
    beside a restart, a kill and a poison pill: no healthy job failed, no stall counted for a
    deploy, the pill dead-lettered after exactly max_stalled counted stalls."""
    out = tmp_path / 'chaos.json'
    argv = [
        sys.executable, '-m', 'benchmarks.chaos', *DEPLOY_SMALL, '--json', str(out), '--workdir', str(tmp_path / 'w'),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f'the chaos run took more than 300 s:\n{output}') from None
    print(output)
    assert proc.returncode == 0, output
    side = json.loads(out.read_text())['sides']['rq-epoch']
    row = side['row']
    assert side['violations'] == []
    assert (row['deploys'], row['deploy_stops']) == (2, 6)
    stopped_running = [e for e in side['events'] if e['kind'] == 'deploy-stop' and e['horses']]
    assert stopped_running, 'a deploy met a running job'
    assert row['handed_back'] + row['stopping_verdicts'] >= 1
    assert (row['deploy_stalls'], row['healthy_failed'], row['lost'], row['stuck']) == (0, 0, 0, 0)
    assert (row['pills_dead'], row['pill_stalls']) == (1, [2])
