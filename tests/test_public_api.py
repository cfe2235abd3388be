"""The public surface: what the package exports is documented, its errors share one base, and
its version is written in one place. No server needed."""

from __future__ import annotations

import configparser
import functools
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
import warnings
from types import ModuleType

import pytest
import redis
from packaging.version import Version
from rq.exceptions import AbandonedJobError

import rq_epoch
import rq_epoch.errors
from rq_epoch import OutcomeInterrupted, OutcomeRefused, RqEpochError
from tests.conftest import ROOT

API_PAGE = ROOT / 'docs' / 'python-api.md'


def package_modules() -> list[ModuleType]:
    """Every module of the package, imported (the demo and the exporter included)."""
    found = [rq_epoch]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)  # an old module path kept for a release
        for info in pkgutil.walk_packages(rq_epoch.__path__, prefix='rq_epoch.'):
            found.append(importlib.import_module(info.name))
    return found


@functools.cache
def exception_classes() -> dict[str, type[BaseException]]:
    """Every public exception class defined in the package or exported by it, by qualified name
    (a private one, named ``_...``, carries an error inside its module and is never raised out of it)."""
    classes: dict[str, type[BaseException]] = {}
    for module in package_modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, BaseException)
                and value.__module__.startswith('rq_epoch')
                and not value.__qualname__.startswith('_')
            ):
                classes[f'{value.__module__}.{value.__qualname__}'] = value
    for name in rq_epoch.__all__:
        value = getattr(rq_epoch, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            classes[f'{value.__module__}.{value.__qualname__}'] = value
    return classes


def test_the_walk_finds_the_exported_errors_and_those_of_submodules() -> None:
    found = set(exception_classes().values())
    assert {RqEpochError, OutcomeRefused, rq_epoch.StalledJobError, rq_epoch.ServerOutageError} <= found
    assert any(cls.__module__ == 'rq_epoch.demo.common' for cls in found)  # DemoError, outside errors.py


@pytest.mark.parametrize('name', sorted(exception_classes()))
def test_every_error_derives_from_rq_epoch_error(name: str) -> None:
    """Each of the package's exceptions is an RqEpochError, except OutcomeRefused and
    OutcomeInterrupted: BaseExceptions that must cross ``except Exception`` blocks (RqEpochError
    is an Exception, so they cannot be both)."""
    cls = exception_classes()[name]
    if cls in (OutcomeRefused, OutcomeInterrupted):
        assert not issubclass(cls, Exception)
        return
    assert issubclass(cls, RqEpochError), f'{name} does not derive from rq_epoch.RqEpochError'


def test_every_name_in_errors_all_is_exported_by_the_package() -> None:
    assert set(rq_epoch.errors.__all__) <= set(rq_epoch.__all__)


def test_the_errors_keep_the_bases_that_existing_handlers_catch() -> None:
    assert issubclass(rq_epoch.StalledJobError, AbandonedJobError)
    assert issubclass(rq_epoch.ConfigurationError, ValueError)
    assert issubclass(rq_epoch.ServerOutageError, redis.exceptions.ConnectionError)


# -- the version ------------------------------------------------------------------------------


def test_the_version_is_written_once_and_read_by_the_build() -> None:
    """setup.cfg takes the version from ``rq_epoch.__version__``; pyproject.toml declares none."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / 'setup.cfg')
    assert setup['metadata']['version'].strip() == 'attr: rq_epoch.__version__'
    assert not re.search(r'^\s*version\s*=', (ROOT / 'pyproject.toml').read_text(), flags=re.MULTILINE)


def test_the_installed_distribution_has_the_packages_version() -> None:
    installed = importlib.metadata.version('rq-epoch')
    assert installed == rq_epoch.__version__, (
        f'the installed rq-epoch says {installed}, the code {rq_epoch.__version__}: reinstall it (pip install -e .)'
    )


def test_unreleased_changes_carry_a_development_version_after_the_last_release() -> None:
    """A version number that was released names that release only: while the changelog has an
    Unreleased section, __version__ is a pre-release of a later version."""
    headings = re.findall(r'^## (.+)$', (ROOT / 'CHANGELOG.md').read_text(), flags=re.MULTILINE)
    released = [Version(h) for h in headings if re.fullmatch(r'\d+(\.\d+)*', h.strip())]
    version = Version(rq_epoch.__version__)
    assert released, headings
    assert version > max(released)
    if headings[0].strip() == 'Unreleased':
        assert version.is_prerelease, f'{version} is a release number, but the changelog has unreleased changes'
    else:
        assert version == Version(headings[0]), 'the newest changelog section names the version'


# -- the documentation of the exported names --------------------------------------------------


@pytest.mark.parametrize('name', sorted(rq_epoch.__all__))
def test_every_exported_name_is_documented_in_the_python_api_page(name: str) -> None:
    page = API_PAGE.read_text()
    assert re.search(rf'`rq_epoch\.{re.escape(name)}\b', page), f'docs/python-api.md does not document rq_epoch.{name}'


def test_the_python_api_page_names_only_what_the_package_exports() -> None:
    page = API_PAGE.read_text()
    named = set(re.findall(r'`rq_epoch\.([A-Za-z_]\w*)', page))
    assert named, 'the page names no rq_epoch.<name>'
    assert named <= set(rq_epoch.__all__), sorted(named - set(rq_epoch.__all__))
