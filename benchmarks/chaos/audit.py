"""The audit: every job checked against the ledger the jobs wrote outside Redis, and the invariants."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from rq.job import Job as RQJob
from rq.queue import Queue as RQQueue

import rq_epoch
from rq_epoch.compat import text as _text
from rq_epoch.protocol import keys

from .plan import ALLOWED_REASONS, EPOCH, FAILOVER_TAIL, SERVER_ERRORS, Config, Plan
from .results import Attempt, JobAudit, SideResult

if TYPE_CHECKING:
    from .side import SideRun


def read_ledger(path: Path) -> tuple[dict[str, list[Attempt]], Counter[str], dict[str, list[str]]]:
    """Attempts per job, callbacks per job, and each job's raw ledger lines."""
    attempts: dict[str, dict[int, Attempt]] = {}
    callbacks: Counter[str] = Counter()
    lines: dict[str, list[str]] = {}
    if not path.exists():
        return {}, callbacks, lines
    for line in path.read_text(encoding='utf-8', errors='replace').splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        event, job_id, n, pid, ppid, t = parts[:6]
        lines.setdefault(job_id, []).append(line)
        if event == 'callback':
            callbacks[job_id] += 1
        elif event == 'start':
            attempts.setdefault(job_id, {})[int(n)] = Attempt(int(n), int(pid), int(ppid), float(t))
        elif event == 'end' and int(n) in attempts.get(job_id, {}):
            attempts[job_id][int(n)].end = float(t)
    ordered = {job_id: sorted(a.values(), key=lambda x: x.start) for job_id, a in attempts.items()}
    return ordered, callbacks, lines


def in_order_of_start(attempts: list[Attempt], events: list[dict[str, Any]]) -> list[Attempt]:
    """A job's executions in the order they began, which is not always the order of their ledger lines.

    The ledger's start line is written by the job function. A work-horse frozen after its fork
    and before the job function ran (its worker had already started the job, and held its
    lease) writes that line only after it is thawed, possibly after another execution of the
    same job: such an execution began no later than the freeze that named its horse.
    """

    def began(attempt: Attempt) -> float:
        frozen = [e['t'] for e in events if e['kind'] == 'freeze' and attempt.pid in e.get('horses', [])]
        return min([attempt.start, *frozen])

    return sorted(attempts, key=began)


def explain(attempt: Attempt, following: float | None, pill: bool, events: list[dict[str, Any]]) -> str:
    """Why an execution was followed by another one: the fault that hit it, if any.

    A kill or freeze hit the execution when its work-horse was among the processes
    signalled (else, when the horse was not seen, when its worker was signalled while the
    execution ran); the earliest such fault is the reason.
    """
    if pill:
        return 'poison pill'
    until = attempt.end + 2.0 if attempt.end is not None else (following if following is not None else float('inf'))
    faults = [e for e in events if e['kind'] in ('kill', 'freeze', 'deploy-stop')]
    hit = [e for e in faults if attempt.pid in e.get('horses', [])]
    if not hit:
        hit = [
            e for e in faults
            if e.get('pid') == attempt.ppid and not e.get('horses') and attempt.start - 0.05 <= e['t'] <= until
        ]  # fmt: skip
    if hit:
        kind = str(min(hit, key=lambda e: e['t'])['kind'])
        return 'deploy' if kind == 'deploy-stop' else kind
    outages = _outages(events)
    in_outage = any(down <= until and up + 5 >= attempt.start for down, up in outages)
    in_failover = any(start <= until and end + FAILOVER_TAIL >= attempt.start for start, end in _failovers(events))
    own_exit = [
        e for e in events
        if e['kind'] == 'worker-exit' and e.get('pid') == attempt.ppid and e['cause'] != 'harness kill'
        and attempt.start - 0.05 <= e['t'] <= until
    ]  # fmt: skip
    if own_exit:
        return 'restart' if in_outage else ('failover' if in_failover else 'worker exit')
    if in_failover:  # also two executions at once: one of them took the job from the old primary
        return 'failover'
    if following is not None and attempt.end is not None and following < attempt.end:
        return 'ran twice at once'
    if in_outage:
        return 'restart'
    return 'unexplained'


#: A worker's log line about a job it holds: RQ's line when it takes the job, and its outcome
#: lines ("<time> Worker <name>: <queue>: <description> (<job id>)", "... Job OK (<job id>)").
_HELD_LINE = re.compile(r'^(\d\d):(\d\d):(\d\d) Worker \S+: .*\(([^()\s]+)\)$')


def read_takes(folder: Path, events: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """(worker pid, second of the day in local time) of each line in which a worker names a
    job it holds, by job id; from the workers' logs, named in the harness's worker-start events."""
    pids = {e['log']: e['pid'] for e in events if e['kind'] == 'worker-start' and e.get('log')}
    takes: dict[str, list[tuple[int, int]]] = {}
    for log in sorted(folder.glob('worker-*.log')):
        pid = pids.get(log.name)
        if pid is None:
            continue
        for line in log.read_text(errors='replace').splitlines():
            match = _HELD_LINE.match(line.strip())
            if match:
                h, m, sec, job_id = match.groups()
                takes.setdefault(job_id, []).append((pid, int(h) * 3600 + int(m) * 60 + int(sec)))
    return takes


#: rq-epoch's log line of a counted verdict (``_LOG_VERDICT_MSG`` in ``rq_epoch/sweep/sweeper.py``).
_COUNTED_LINE = re.compile(
    r'sweep: job (\S+) queue \S+ verdict (?:recovered|dead) stalled (\d+)/\d+ lease_epoch (\S*) run_id (\S+)'
)


def counted_by_a_later_process(folder: Path) -> int:
    """Counted verdicts (recovered, dead) given by a server process other than the one that stamped
    the lease: deaths counted after a restart or failover, by the record of life. From the
    workers' logs and the cron sweeper's records; each (job, stall count) once."""
    found: set[tuple[str, str]] = set()
    for log in sorted(folder.glob('worker-*.log')):
        for line in log.read_text(errors='replace').splitlines():
            match = _COUNTED_LINE.search(line)
            if match and match.group(3) != match.group(4):
                found.add((match.group(1), match.group(2)))
    sweeps = folder / 'sweeper.jsonl'
    if sweeps.exists():
        for line in sweeps.read_text(errors='replace').splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get('verdict') in ('recovered', 'dead') and record.get('lease_epoch') != record.get('run_id'):
                found.add((str(record.get('job_id')), str(record.get('stalled'))))
    return len(found)


def held_faults(attempts: list[Attempt], takes: list[tuple[int, int]], events: list[dict[str, Any]]) -> int:
    """Kills and freezes of workers that held the job after their log named it, and never began
    it: at most one per worker, none for a worker with an execution of the job in the ledger
    (those are the executions' own reasons)."""
    return len(held_fault_times(attempts, takes, events))


def held_fault_times(
    attempts: list[Attempt], takes: list[tuple[int, int]], events: list[dict[str, Any]]
) -> list[float]:
    """The times of the faults :func:`held_faults` counts."""
    ran = {a.ppid for a in attempts}
    hit: list[float] = []
    for pid in sorted({pid for pid, _ in takes} - ran):
        first = min(second for p, second in takes if p == pid)
        for e in events:
            if e['kind'] in ('kill', 'freeze') and e.get('pid') == pid:
                at = time.localtime(e['t'])
                second = at.tm_hour * 3600 + at.tm_min * 60 + at.tm_sec
                if second < first - 43_200:  # the run went past midnight
                    second += 86_400
                if second >= first:
                    hit.append(float(e['t']))
                    break
    return hit


def death_time(attempt: Attempt, events: list[dict[str, Any]]) -> float | None:
    """When the fault named by an execution's reason hit it: the pill's start, or the kill or
    freeze that :func:`explain` found (the earliest that named its horse, else its worker)."""
    if attempt.reason == 'poison pill':
        return attempt.start
    if attempt.reason not in ('kill', 'freeze'):
        return None
    faults = [e for e in events if e['kind'] == attempt.reason]
    hit = [e for e in faults if attempt.pid in e.get('horses', [])]
    hit = hit or [e for e in faults if e.get('pid') == attempt.ppid and e['t'] >= attempt.start - 0.05]
    return min(float(e['t']) for e in hit) if hit else None


def boundaries(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Moments after which a lease's granting process no longer serves the dataset, as
    (from, to): a restart (its server-down event), a failover (asked, until the promotion seen),
    a frozen primary (frozen, until the promotion seen)."""
    out = [(down, down) for down, _ in _outages(events)]
    start: float | None = None
    for e in events:
        if e['kind'] in ('failover', 'primary-freeze'):
            start = e['t']
        elif e['kind'] == 'failover-refused':
            start = None
        elif e['kind'] == 'promoted' and start is not None:
            out.append((start, e['t']))
            start = None
    if start is not None:
        out.append((start, float('inf')))
    return sorted(out)


def judge_death(t: float, cfg: Config, events: list[dict[str, Any]]) -> str:
    """Whether a worker's death at ``t`` should count: ``count``, ``exempt`` or ``band``.

    The lease's last heartbeat was at most one heartbeat before the death (or before the server
    went down, for a death during an outage), so its deadline lies one lease after that. The
    death should count when that deadline passed while the granting process still served, at
    least one sweep interval before the next restart or failover (the scripts note the server
    alive about once a second, and a sweep judges at once); it should not when the deadline
    came at least one sweep interval after it; in between, it is in the band.

    A death in the last part of an outage as the harness recorded it, after the server was
    started again (its 'started'), is in the band: the server may have been answering already,
    and the worker may have been granted its lease there. A death soon after the server came
    back is in the band too: a heartbeat that failed during the outage is tried again only at
    the next heartbeat, so the first to reach the new process (and re-stamp the lease) may come
    up to two heartbeat intervals after it is up; until then the lease still carries the stamp
    of the process before the restart. After a failover (or a frozen primary) the same holds for
    longer: a worker may go on writing to the demoted primary for up to ``FAILOVER_TAIL`` seconds
    after the promotion (its heartbeats there are lost), so a death within that tail and two
    heartbeats after it is in the band.
    """
    heartbeat, lease, band = float(cfg.heartbeat), cfg.lease(EPOCH), float(cfg.sweep_interval)
    last_lo, last_hi, during_outage = t - heartbeat, t, False
    for down, up in _outages(events):
        if down <= t <= up and t >= _started_again(up, events):
            return 'band'  # the server may have been answering already
        if down <= t <= up:
            last_lo, last_hi, during_outage = down - heartbeat, down, True
        elif up < t <= up + 2 * heartbeat:
            return 'band'  # the last heartbeat that landed may have gone to the process before
    for _, promoted in _failovers(events):
        if promoted < t <= promoted + FAILOVER_TAIL + 2 * heartbeat:
            return 'band'  # the worker may not have reached the new primary yet
    deadline_lo, deadline_hi = last_lo + lease, last_hi + lease
    ahead = [b for b in boundaries(events) if b[1] >= last_lo]
    if not ahead:
        return 'count'
    start, end = ahead[0]
    if start <= last_hi and not during_outage:
        return 'band'  # the last heartbeat may have gone to either side of the boundary
    if deadline_hi + band < start:
        return 'count'
    if deadline_lo - band > end:
        return 'exempt'
    return 'band'


def judge_deaths(
    attempts: list[Attempt], held: list[float], cfg: Config, events: list[dict[str, Any]]
) -> tuple[int, int, int]:
    """(should count, in the band, should not) over a job's deaths. A fault on a worker that
    held the job and never began it is in the band: the job may not have started (a lease of
    a job that never started is never counted)."""
    verdicts = Counter(judge_death(t, cfg, events) for a in attempts if (t := death_time(a, events)) is not None)
    return verdicts['count'], verdicts['band'] + len(held), verdicts['exempt']


def _failovers(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Failovers and frozen primaries from the event log, as (start, promoted or thawed) times."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    frozen = False
    for e in events:
        kind = e['kind']
        if kind in ('failover', 'primary-freeze'):
            start, frozen = e['t'], kind == 'primary-freeze'
        elif kind == 'failover-refused':
            start = None
        elif start is not None and ((kind == 'promoted' and not frozen) or kind == 'primary-thaw'):
            out.append((start, e['t']))
            start = None
    if start is not None:
        out.append((start, float('inf')))
    return out


def _started_again(up: float, events: list[dict[str, Any]]) -> float:
    """When the server that answered at ``up`` was started (its server-up event's 'started';
    ``up`` itself for an event without one)."""
    for e in events:
        if e['kind'] == 'server-up' and e['t'] == up:
            return float(e.get('started', up))
    return up


def _outages(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Server outages from the event log, as (down, up) times."""
    out: list[tuple[float, float]] = []
    down: float | None = None
    for e in events:
        if e['kind'] == 'server-down':
            down = e['t']
        elif e['kind'] == 'server-up' and down is not None:
            out.append((down, e['t']))
            down = None
    if down is not None:
        out.append((down, float('inf')))
    return out


def audit(run: SideRun, wall: float) -> SideResult:
    """Audit every job of a side against the ledger; check rq-epoch's invariants."""
    cfg, plan, side = run.cfg, run.plan, run.side
    client = run.client(socket_timeout=30)
    try:
        return _audit(client, run, cfg, plan, side, wall)
    finally:
        client.close()


def _audit(client: redis.Redis, run: SideRun, cfg: Config, plan: Plan, side: str, wall: float) -> SideResult:
    """Read the final state of every job and attribute its executions."""
    attempts, callbacks, ledger_lines = read_ledger(run.ledger)
    events = run.recorder.events
    takes = read_takes(run.folder, events)
    queued: set[str] = set()
    intermediate: set[str] = set()
    wip: set[str] = set()
    leases: set[str] = set()
    deferred: set[str] = set()
    ready: set[str] = set()
    scheduled: set[str] = set()
    failed_reg: set[str] = set()
    finished_reg: set[str] = set()
    for name in cfg.queue_names:
        queue = RQQueue(name, connection=client)
        queued |= {_text(x) for x in client.lrange(queue.key, 0, -1)}
        intermediate |= {_text(x) for x in client.lrange(keys.intermediate_key(name), 0, -1)}
        wip |= {_text(x).split(':', 1)[0] for x in client.zrange(keys.wip_key(name), 0, -1)}
        leases |= {_text(x).split(':', 1)[0] for x in client.zrange(keys.leases_key(name), 0, -1)}
        deferred |= {_text(x) for x in client.zrange(keys.registry_key('deferred', name), 0, -1)}
        ready |= {_text(x) for x in client.zrange(keys.registry_key('ready', name), 0, -1)}  # RQ 3
        scheduled |= {_text(x) for x in client.zrange(keys.registry_key('scheduled', name), 0, -1)}
        failed_reg |= {_text(x) for x in client.zrange(keys.failed_key(name), 0, -1)}
        finished_reg |= {_text(x) for x in client.zrange(keys.registry_key('finished', name), 0, -1)}
    job_class = rq_epoch.Job if side == EPOCH else RQJob
    jobs: list[JobAudit] = []
    for spec in plan.jobs:
        raw = {_text(k): _text(v) for k, v in client.hgetall(keys.job_key(spec.id)).items()}
        status = raw.get('status', '')
        where = ','.join(
            name
            for name, members in (
                ('queue', queued),
                ('intermediate', intermediate),
                ('started', wip),
                ('lease', leases),
                ('deferred', deferred),
                ('ready', ready),
                ('scheduled', scheduled),
                ('failed', failed_reg),
                ('finished', finished_reg),
            )
            if spec.id in members
        )
        results, worker_results, failure = 0, 0, ''
        if raw:
            try:
                job = job_class.fetch(spec.id, connection=client)
                found = job.results()
                results = len(found)
                worker_results = sum(1 for r in found if getattr(r, 'worker_name', ''))
                latest = found[0] if found else None
                if status == 'failed':
                    failure = _text(getattr(latest, 'exc_string', '') or job.exc_info or '').strip()
                    failure = failure.splitlines()[-1] if failure else ''
            except Exception as exc:  # noqa: BLE001 - the audit reports, it does not stop
                failure = f'(unreadable: {exc})'
        if status in ('finished', 'failed'):
            state = status
        elif not raw:
            state = 'lost'
        elif (
            spec.id in queued
            or spec.id in intermediate
            or spec.id in wip
            or spec.id in leases
            or spec.id in deferred
            or spec.id in ready
            or spec.id in scheduled
        ):
            state = 'stuck'
        else:
            state = 'lost'
        retries_left = raw.get('retries_left', '')
        spent = cfg.retry_budget - int(retries_left) if retries_left.lstrip('-').isdigit() and cfg.retry_budget else 0
        job_attempts = in_order_of_start(attempts.get(spec.id, []), events)
        for i, attempt in enumerate(job_attempts[:-1]):
            attempt.reason = explain(attempt, job_attempts[i + 1].start, spec.kind == 'pill', events)
        if job_attempts and state not in ('finished',):
            # What ended the last execution of a job that did not finish.
            job_attempts[-1].reason = explain(job_attempts[-1], None, spec.kind == 'pill', events)
        held = held_fault_times(job_attempts, takes.get(spec.id, []), events)
        should, band, exempt = judge_deaths(job_attempts, held, cfg, events)
        jobs.append(
            JobAudit(
                id=spec.id,
                kind=spec.kind,
                status=status or '(gone)',
                state=state,
                attempts=job_attempts,
                callbacks=callbacks.get(spec.id, 0),
                stalled=int(raw.get('stalled') or 0),
                exempt=int(raw.get('exempt_recoveries') or 0),
                retries_spent=max(0, spent),
                results=results,
                failure=failure,
                where=where,
                worker_results=worker_results,
                held_faults=len(held),
                deaths_count=should,
                deaths_band=band,
                deaths_exempt=exempt,
            )
        )
    violations: list[str] = []
    histories: dict[str, list[str]] = {}
    notes: list[str] = []
    if run.producer is not None and run.producer.errors:
        notes += run.producer.errors
    if run.producer is not None and run.producer.unconfirmed:
        notes.append(
            f'enqueues reported unconfirmed to the producer (EnqueueNotConfirmed): {len(run.producer.unconfirmed)} '
            f'({", ".join(run.producer.unconfirmed[:10])})'
        )
    if side == EPOCH:
        violations = check_invariants(jobs, cfg)
        for job_id in sorted({v.split(':', 1)[0] for v in violations}):
            histories[job_id] = job_history(job_id, client, run, jobs, ledger_lines, events)
    refused = sum(int(client.hget(keys.stats_key(name), 'refused') or 0) for name in cfg.queue_names)
    handed_back = sum(int(client.hget(keys.stats_key(name), 'handed_back') or 0) for name in cfg.queue_names)
    stopping = sum(int(client.hget(keys.stats_key(name), 'stopping') or 0) for name in cfg.queue_names)
    across = counted_by_a_later_process(run.folder) if side == EPOCH else 0
    return SideResult(
        side, wall, jobs, events, violations, histories, notes, cfg.max_stalled, refused, across, handed_back, stopping
    )


def check_invariants(jobs: Sequence[JobAudit], cfg: Config) -> list[str]:
    """rq-epoch's invariants; each violation is ``'<job id>: <what>'``."""
    out: list[str] = []
    allowed = ALLOWED_REASONS
    if cfg.topology == 'sentinel' and cfg.min_replicas < cfg.replicas:
        # Replication is asynchronous: a write the old primary took in the instant between the
        # promotion and the moment the sentinels name the new primary (an outcome, a grant) is
        # lost with every other write there, unless every replica had to acknowledge it. Such
        # a job may run again, but uncounted: the stall check below still applies.
        allowed = ALLOWED_REASONS | {'failover'}
    for job in jobs:
        if job.state in ('lost', 'stuck'):
            out.append(f'{job.id}: {job.state} (status {job.status}, in {job.where or "nothing"})')
        if job.kind == 'healthy' and job.state == 'failed':
            out.append(f'{job.id}: healthy job failed: {job.failure}')
        elif job.kind == 'healthy' and job.retries_spent:
            # A healthy job never raises: a spent retry is a failure the infrastructure caused.
            out.append(f'{job.id}: healthy job failed {job.retries_spent} time(s) and was retried')
        if job.kind == 'pill':
            if job.state != 'failed' or 'failed' not in job.where.split(','):
                out.append(f'{job.id}: poison pill not dead-lettered (status {job.status}, in {job.where})')
            elif job.stalled != cfg.max_stalled:
                out.append(f'{job.id}: poison pill dead after {job.stalled} counted stalls, not {cfg.max_stalled}')
            elif not cfg.max_stalled <= job.executions <= cfg.max_stalled + job.exempt:
                out.append(
                    f'{job.id}: poison pill ran {job.executions} times for {job.stalled} counted stalls and '
                    f'{job.exempt} uncounted recoveries'
                )
            elif job.deaths_band == job.deaths_exempt == 0 and job.executions != cfg.max_stalled:
                out.append(
                    f'{job.id}: poison pill ran {job.executions} times, not {cfg.max_stalled}, though every death '
                    'should have counted (no restart or failover within a lease of one)'
                )
        for attempt in job.attempts[:-1]:
            if attempt.reason not in allowed:
                out.append(
                    f'{job.id}: ran again after execution {attempt.n} (worker {attempt.ppid}) without a kill or '
                    f'freeze of its worker ({attempt.reason})'
                )
        if job.stale_outcomes:
            out.append(f'{job.id}: {job.stale_outcomes} outcome(s) of a superseded execution landed')
        hits = sum(1 for a in job.attempts[:-1] if a.reason in ('kill', 'freeze')) + job.held_faults
        if job.kind == 'healthy' and job.stalled > hits:
            out.append(f'{job.id}: {job.stalled} counted stall(s) but only {hits} kill/freeze of its workers')
        elif job.deaths_counted_wrongly:
            out.append(
                f'{job.id}: {job.stalled} counted stall(s) but only {job.deaths_count} death(s) that should count '
                f'and {job.deaths_band} in the band'
            )
    return out


def job_history(
    job_id: str,
    client: redis.Redis,
    run: SideRun,
    jobs: Sequence[JobAudit],
    ledger_lines: dict[str, list[str]],
    events: list[dict[str, Any]],
) -> list[str]:
    """Everything about one job: ledger, job hash, faults on its workers, sweeps, worker logs."""
    out: list[str] = []
    audit_row = next((j for j in jobs if j.id == job_id), None)
    if audit_row is not None:
        out.append(
            f'audit: state {audit_row.state}, status {audit_row.status}, in {audit_row.where}, '
            f'stalled {audit_row.stalled}, exempt {audit_row.exempt}, results {audit_row.results}'
        )
        for a in audit_row.attempts:
            out.append(f'  execution {a.n}: horse {a.pid} worker {a.ppid} start {a.start:.3f} end {a.end} {a.reason}')
    out += [f'ledger: {line}' for line in ledger_lines.get(job_id, [])]
    try:
        raw = client.hgetall(keys.job_key(job_id))
        fields = (
            'status',
            'origin',
            'stalled',
            'exempt_recoveries',
            'lease_epoch',
            'lease_execution',
            'stall_epochs',
            'retries_left',
            'worker_name',
            'started_at',
            'ended_at',
            'enqueued_at',
        )
        out.append('job hash: ' + ', '.join(f'{f}={_text(raw.get(f.encode()))}' for f in fields if f.encode() in raw))
    except SERVER_ERRORS as exc:
        out.append(f'job hash: unreadable ({exc})')
    pids = {a.ppid for a in (audit_row.attempts if audit_row else [])}
    for e in events:
        if e.get('pid') in pids or e['kind'] in ('server-down', 'server-up'):
            out.append(f'event: +{e["rel"]}s {json.dumps({k: v for k, v in e.items() if k not in ("t", "rel")})}')
    sweeps = run.folder / 'sweeper.jsonl'
    if sweeps.exists():
        for line in sweeps.read_text(errors='replace').splitlines():
            if f'"{job_id}"' in line:
                out.append(f'cron sweeper: {line}')
    for log in sorted(run.folder.glob('worker-*.log')):
        for line in log.read_text(errors='replace').splitlines():
            if job_id in line:
                out.append(f'{log.name}: {line.strip()}')
    return out
