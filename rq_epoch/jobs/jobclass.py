"""Any RQ job class, given the epoch behaviour at run time.

``rq worker --worker-class rq_epoch.Worker --job-class myapp.MyJob`` works with a job class
derived from RQ's Job (for tracing, custom serialization...): the worker, the sweep and
the ``rq-epoch`` command use the *epoch variant* of ``MyJob``, a class composed once per
process as ``EpochJobMixin + MyJob``. It has MyJob's name, qualified name and module, so
logs and ``repr`` read the same, it is a subclass of MyJob (``isinstance`` checks in your
code hold), and it pickles as "the epoch variant of MyJob" (RQ 3's spawn worker pickles
the job class).

A job object of another class handed to the worker (``worker.execute_job(job, queue)``
with a job fetched as RQ's Job) is given the behaviour in place by :func:`adopt`, so every
job the worker starts holds a lease.
"""

from __future__ import annotations

import copyreg
import threading
from typing import Any, TypeVar

from rq.job import Job as RQJob
from rq.utils import import_attribute

from ..adapters import rq as rq_adapter
from ..errors import ConfigurationError
from .job import EpochJobMixin, Job

__all__ = ['adopt', 'epoch_job_class', 'is_epoch_job_class', 'resolve_job_class']

_lock = threading.Lock()
#: Epoch variant of each class composed so far.
_composed: dict[type, type] = {}
#: Metaclass of composed classes, per metaclass of the class composed.
_metaclasses: dict[type, type] = {}

T = TypeVar('T', bound=RQJob)


class EpochComposed(type):
    """Metaclass of composed job classes: pickles a class as ``epoch_job_class(base)``."""


def _reduce(cls: type) -> tuple[Any, tuple[type]]:
    return epoch_job_class, (cls.__dict__['_rq_epoch_base'],)


copyreg.pickle(EpochComposed, _reduce)


def _metaclass_for(base: type) -> type:
    meta = type(base)
    if meta is type:
        return EpochComposed
    found = _metaclasses.get(meta)
    if found is None:
        found = type(f'EpochComposed{meta.__name__}', (EpochComposed, meta), {'__module__': __name__})
        copyreg.pickle(found, _reduce)
        _metaclasses[meta] = found
    return found


def is_epoch_job_class(cls: Any) -> bool:
    """Whether ``cls`` is a job class with the epoch behaviour (rq_epoch.Job, derived or composed)."""
    return isinstance(cls, type) and issubclass(cls, EpochJobMixin) and issubclass(cls, RQJob)


def epoch_job_class(job_class: Any = None) -> type[Job]:
    """The epoch variant of a job class: what the worker, the sweep and the CLI use.

    * None, RQ's Job (or its dotted path ``rq.job.Job``): :class:`rq_epoch.Job`;
    * a class that already has the behaviour (derived from rq_epoch.Job): itself;
    * any other class derived from RQ's Job: ``EpochJobMixin + job_class``, composed once
      and cached, with the same ``__name__``, ``__qualname__`` and ``__module__``.

    The return type says ``rq_epoch.Job`` for type checkers: the composed class has
    every attribute of it, though it is not a subclass of it.

    Raises:
        ConfigurationError: ``job_class`` (or what its dotted path names) is not a class
            derived from RQ's Job.
    """
    if job_class is None:
        return Job
    if isinstance(job_class, str):
        job_class = _import(job_class)
    if job_class is RQJob:
        return Job
    if is_epoch_job_class(job_class):
        return job_class  # type: ignore[no-any-return]
    if not (isinstance(job_class, type) and issubclass(job_class, RQJob)):
        raise ConfigurationError(f'a job class must derive from rq.job.Job, got {job_class!r}')
    with _lock:
        composed = _composed.get(job_class)
        if composed is None:
            meta = _metaclass_for(job_class)
            namespace = {
                '__module__': job_class.__module__,
                '__qualname__': job_class.__qualname__,
                '__doc__': job_class.__doc__,
                '_rq_epoch_base': job_class,
            }
            composed = meta(job_class.__name__, (EpochJobMixin, job_class), namespace)
            _composed[job_class] = composed
    return composed  # type: ignore[return-value]


def _import(path: str) -> Any:
    try:
        return import_attribute(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is a configuration error
        raise ConfigurationError(f'cannot import the job class {path!r}: {exc}') from exc


def resolve_job_class(owner: type, requested: Any = None) -> type[Job]:
    """The epoch variant of the job class asked for, else of the ``job_class`` attribute of ``owner``.

    What :class:`rq_epoch.Worker` and :class:`rq_epoch.Sweeper` do with their ``job_class``
    argument, alike. RQ's own Job (what the rq CLI passes when ``--job-class`` is not
    given) counts as not asked for, so a subclass's ``job_class = MyJob`` is respected
    under the CLI too.

    Raises:
        ConfigurationError: the class asked for, or the attribute, is not derived from RQ's Job.
    """
    if isinstance(requested, str):
        requested = _import(requested)
    if requested is None or requested is RQJob:
        requested = getattr(owner, 'job_class', None)
    return epoch_job_class(requested)


def adopt(job: T) -> T:
    """Give a job object the epoch behaviour in place (its class becomes the epoch variant).

    A job that has it already is returned as it is. The object keeps its data; what the
    epoch fields would have read from the job hash (stamp, counters) only matters to the
    sweep, which reads the hash itself.
    """
    cls = type(job)
    if not issubclass(cls, EpochJobMixin):
        rq_adapter.change_job_class(job, epoch_job_class(cls))
    return job
