"""The module paths of the flat layout keep working for one release: each warns, naming the new path,
and gives the very objects of the module that took its place. ``rq_epoch.worker`` and
``rq_epoch.sweep``, packages now, offer what the modules offered, without a warning."""

from __future__ import annotations

import importlib
import importlib.resources
import re
import sys
import warnings

import pytest

import rq_epoch

MOVED = {
    'rq_epoch.cli': 'rq_epoch.ops.cli',
    'rq_epoch.dependents': 'rq_epoch.sweep.dependents',
    'rq_epoch.epoch': 'rq_epoch.protocol.epoch',
    'rq_epoch.failover': 'rq_epoch.worker.failover',
    'rq_epoch.fence': 'rq_epoch.worker.fence',
    'rq_epoch.flavours': 'rq_epoch.worker.flavours',
    'rq_epoch.job': 'rq_epoch.jobs.job',
    'rq_epoch.jobclass': 'rq_epoch.jobs.jobclass',
    'rq_epoch.keys': 'rq_epoch.protocol.keys',
    'rq_epoch.metrics': 'rq_epoch.ops.metrics',
    'rq_epoch.queue': 'rq_epoch.jobs.queue',
    'rq_epoch.registry': 'rq_epoch.jobs.job',
    'rq_epoch.report': 'rq_epoch.protocol.report',
    'rq_epoch.scripts': 'rq_epoch.protocol.scripts',
    'rq_epoch.server': 'rq_epoch.protocol.server',
    'rq_epoch.take': 'rq_epoch.worker.take',
    'rq_epoch.tickets': 'rq_epoch.worker.tickets',
    'rq_epoch.verbs': 'rq_epoch.protocol.verbs',
    'rq_epoch.verdicts': 'rq_epoch.protocol.verdicts',
}


@pytest.mark.parametrize(('old', 'new'), sorted(MOVED.items()))
def test_an_old_path_warns_and_gives_the_same_objects(old: str, new: str) -> None:
    sys.modules.pop(old, None)  # imported afresh: the warning is given at the import
    with pytest.warns(DeprecationWarning, match=re.escape(f'{old} moved to {new}')) as caught:
        module = __import__(old, fromlist=['*'])  # as an import statement does
    assert [w.filename for w in caught] == [__file__]  # the warning names the line that imports the old path
    target = importlib.import_module(new)
    assert module.__all__
    assert set(module.__all__) <= set(target.__all__)
    for name in module.__all__:
        assert getattr(module, name) is getattr(target, name), name
    private = sorted(name for name in vars(target) if name.startswith('_') and not name.startswith('__'))
    for name in private[:3]:  # names outside __all__ are answered by the new module too
        assert getattr(module, name) is getattr(target, name), name


def test_every_old_path_of_the_package_is_listed() -> None:
    root = importlib.resources.files('rq_epoch')
    shims = {
        f'rq_epoch.{entry.name.removesuffix(".py")}'
        for entry in root.iterdir()
        if entry.name.endswith('.py') and 'moved(__name__' in entry.read_text(encoding='utf-8')
    }
    assert shims == set(MOVED)


@pytest.mark.parametrize(
    ('package', 'names'),
    [
        ('rq_epoch.worker', {'Worker': 'rq_epoch.worker.worker', 'wait_while_unavailable': 'rq_epoch.worker.worker'}),
        (
            'rq_epoch.sweep',
            {
                'Sweeper': 'rq_epoch.sweep.sweeper',
                'LeaseVerdict': 'rq_epoch.protocol.report',
                'SweepReport': 'rq_epoch.protocol.report',
                **dict.fromkeys(
                    [
                        'REPLICA_MAX_LAG',
                        'PrimaryState',
                        'ServerEpoch',
                        'primary_state',
                        'read_epoch',
                        'read_primary_state',
                    ],
                    'rq_epoch.protocol.server',
                ),
            },
        ),
    ],
)
def test_a_module_that_became_a_package_offers_its_names_without_a_warning(package: str, names: dict[str, str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)
        module = importlib.reload(importlib.import_module(package))  # its submodules stay as they are
    for name, defined_in in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(defined_in), name), name


def test_the_names_users_give_rq_resolve_to_the_public_classes() -> None:
    from rq.utils import import_attribute

    for path in ('rq_epoch.Worker', 'rq_epoch.SimpleWorker', 'rq_epoch.Job', 'rq_epoch.Queue'):
        assert import_attribute(path) is getattr(rq_epoch, path.rpartition('.')[2])
