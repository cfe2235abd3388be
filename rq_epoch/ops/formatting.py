"""The human form of the CLI's reports: sweep summaries, status, a job's history.

Each function returns lines; the commands print them. The data come from
:class:`rq_epoch.SweepReport`, :func:`rq_epoch.ops.status.read_status` and
:func:`rq_epoch.ops.history.job_history`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..protocol.report import LeaseVerdict, SweepReport
from ..protocol.server import PrimaryState, ServerEpoch
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings
from .status import STATUS_SCAN_LIMIT, grace_left

__all__ = ['format_job', 'format_primary', 'format_status', 'format_sweep', 'format_verdict', 'one_line']

#: Entries of a list shown before "... and N more".
SHOWN = 10

T = TypeVar('T')


def one_line(text: object) -> str:
    """Any text on one line, runs of whitespace as one space."""
    return ' '.join(str(text).split())


def duration(seconds: float) -> str:
    """A duration for people: ``42s``, ``3m 5s``, ``2h 1m``, ``4d 2h``."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f'{days}d {hours}h'
    if hours:
        return f'{hours}h {minutes}m'
    if minutes:
        return f'{minutes}m {secs}s'
    return f'{secs}s'


def _first(items: Sequence[T], line: Callable[[T], str], indent: str = '    ') -> list[str]:
    """A line per item for the first :data:`SHOWN` items, then how many more there are."""
    lines = [indent + line(item) for item in items[:SHOWN]]
    if len(items) > SHOWN:
        lines.append(f'{indent}... and {len(items) - SHOWN} more (see --json)')
    return lines


def format_sweep(report: SweepReport, settings: EpochSettings, *, verbose: bool = False) -> list[str]:
    """The human summary of a sweep: a header, a line per queue with its verdict counts, dead letters."""
    judged = report.total
    head = 'rq-epoch sweep --dry-run (nothing written)' if report.dry_run else 'rq-epoch sweep'
    lines = [
        f'{head}: server epoch {report.run_id} (up {duration(report.uptime)}), '
        f'{len(report.queues)} queue(s), {judged} expired lease(s) '
        + ('would be judged' if report.dry_run else 'judged')
    ]
    width = max((len(name) for name in report.queues), default=0)
    for name in report.queues:
        counts = report.counts(name)
        parts = [f'{counts[v]} {v}' for v in Verdict if counts[v]]
        lines.append(f'  {name:<{width}}  {", ".join(parts) if parts else "nothing expired"}')
    if verbose:
        for v in report.verdicts:
            lines.append('  ' + format_verdict(v))
    for v in report.verdicts:
        if v.verdict is Verdict.DEAD:
            verb = 'would be dead-lettered' if report.dry_run else 'dead-lettered to FailedJobRegistry'
            lines.append(f'  dead letter: job {v.job_id} (queue {v.queue}) stalled {v.stalled}/{v.max_stalled}: {verb}')
    deferred = report.counts()[Verdict.DEFERRED]
    if deferred:
        age = int(report.primary.age) if report.primary is not None else report.uptime
        lines.append(
            f'  {deferred} lease(s) from a previous server process wait for the restart grace '
            f'(primary for {duration(age)}, grace {settings.grace}s): live workers re-stamp theirs meanwhile'
        )
    return lines


def format_verdict(v: LeaseVerdict) -> str:
    """One expired lease and its verdict, on one line."""
    return (
        f'{v.queue} job {v.job_id or "-"} {v.verdict.wording} '
        f'stalled {v.stalled}/{v.max_stalled} lease_epoch {v.lease_epoch or "(none)"}'
    )


def format_primary(primary: PrimaryState) -> str:
    """One line on the server's role: how long it has been primary, its replicas."""
    if not primary.is_primary:
        return f'role {primary.role or "unknown"}: a replica; sweeps judge nothing here (point them at the primary)'
    replicas = f'{primary.replicas_online} replica(s) online'
    if primary.isolated:
        return (
            f'primary ISOLATED: {primary.replicas_expected} replica(s) seen in this epoch, none online now; sweeps '
            'judge nothing here (a demoted or cut-off primary)'
        )
    if not primary.first_seen:
        return f'primary: not yet seen as primary by a sweep (the grace starts at the first sweep); {replicas}'
    age = int(primary.age)
    return f'primary for {duration(age)} ({age}s) (this process, since a sweep first saw it as primary); {replicas}'


def format_status(
    current: ServerEpoch,
    settings: EpochSettings,
    queues: dict[str, dict[str, Any]],
    primary: PrimaryState | None = None,
) -> list[str]:
    """The human form of ``status``."""
    lines = [
        f'server epoch: run_id {current.run_id}, up {duration(current.uptime)} ({current.uptime}s), '
        f'role {current.role or "unknown"}'
    ]
    if primary is not None:
        lines.append(format_primary(primary))
        left = grace_left(primary, settings)
    else:
        left = settings.grace - current.uptime
    if left is not None and left > 0:
        lines.append(
            f'restart grace: {settings.grace}s, {left}s left: leases from an older server process wait, '
            'so that live workers can re-stamp theirs'
        )
    lines.append(f'stall budget: {settings.max_stalled} (jobs enqueued with max_stalled use their own)')
    if not queues:
        lines.append('no queues')
    for name, q in queues.items():
        lines.append(f'queue {name}')
        live = f'{q["live_leases"]}'
        if q['stock_live_leases']:
            live += f' (+{q["stock_live_leases"]} held by stock RQ workers)'
        lines.append(f'  live leases       {live}')
        exp = q['expired']
        detail = ', '.join(f'{exp[v]} {v}' for v in Verdict if exp[v])
        waiting = f'{q["expired_leases"]}'
        if q['expired_leases']:
            waiting += f' ({q["would_be_exempt"]} would be exempt, {q["would_be_counted"]} counted; {detail})'
        lines.append(f'  expired leases    {waiting}')
        stalled = q['stalled_jobs']
        lines.append(f'  jobs stalled > 0  {len(stalled)}')
        lines += _first(
            stalled, lambda job: f'{job["job_id"]}  stalled {job["stalled"]}/{job["max_stalled"]}  {job["status"]}'
        )
        dead = q['dead_letters']
        lines.append(f'  dead letters      {len(dead)} (failed after stalling, in FailedJobRegistry)')
        lines += _first(dead, str)
        counters = q['counters']
        if counters:
            shown = ', '.join(f'{counters[v]} {v}' for v in Verdict if counters.get(v))
            lines.append(f'  sweep counters    {shown or "none"}')
        refused = counters.get('refused', 0)
        lines.append(f'  stale outcomes    {refused} refused (outcomes of executions whose lease had been taken)')
        handed = counters.get('handed_back', 0)
        stopping = counters.get(Verdict.STOPPING.value, 0)
        lines.append(
            f'  handed back       {handed} (jobs workers told to stop gave back), '
            f'{stopping} stopping (their workers killed first; requeued by a sweep), none counted'
        )
        since = q['seconds_since_last_sweep']
        lines.append(f'  last sweep        {duration(int(since)) + " ago" if since is not None else "none recorded"}')
        if q['truncated']:
            lines.append(f'  (only the first {STATUS_SCAN_LIMIT} entries of each registry were read)')
    return lines


def format_job(job: dict[str, Any], current: ServerEpoch) -> list[str]:
    """The human form of ``status --job``."""
    source = "the job's own" if job['max_stalled_source'] == 'job' else 'the default'
    lines = [
        f'job {job["job_id"]} (queue {job["queue"]}): {job["status"]}',
        f'  stalled            {job["stalled"]}/{job["max_stalled"]} (budget: {source})',
    ]
    if job['stall_epochs']:
        counts: dict[str, int] = {}
        for run_id in job['stall_epochs']:
            counts[run_id] = counts.get(run_id, 0) + 1
        for run_id, n in counts.items():
            here = ' (the current server process)' if run_id == current.run_id else ''
            lines.append(f'  counted under      {run_id} x{n}{here}')
    lines.append(f'  exempt recoveries  {job["exempt_recoveries"]} (leases that crossed a restart, not counted)')
    lines.append(f'  handed back        {job["handed_back"]} (its worker was told to stop; not counted)')
    lines.append(
        f'  stopping           {job["stopping_recoveries"]} (its worker was told to stop and killed first; not counted)'
    )
    lease = job['lease']
    stamp = job['lease_epoch'] or '(none)'
    whose = 'the current server process' if job['lease_epoch_is_current'] else 'another server process'
    if lease is None:
        lines.append(f'  lease              none (last stamp {stamp})')
    elif lease['expired']:
        lines.append(
            f'  lease              expired {-lease["seconds_left"]:.1f}s ago, stamped by {stamp} ({whose}): '
            'waiting for a sweep'
        )
    else:
        lines.append(f'  lease              live, {lease["seconds_left"]:.1f}s left, stamped by {stamp} ({whose})')
    dead = 'yes (failed, in FailedJobRegistry)' if job['dead_letter'] else 'no'
    lines.append(f'  dead letter        {dead}')
    lines.append(f'  requeued since     {"yes" if job["requeued_since_dead_letter"] else "no"}')
    for result in job['dead_letter_results']:
        lines.append(f'  dead-lettered      {result["created_at"] or "?"}: {one_line(result["reason"])}')
    return lines
