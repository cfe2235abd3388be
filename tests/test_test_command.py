"""The test command: the README gives it, CI runs it, and the number of test processes is a
visible part of it rather than hidden in pytest's settings (docs/development.md says why)."""

from __future__ import annotations

import configparser
import re
import shlex

from tests.conftest import ROOT


def readme_test_command() -> list[str]:
    """The pytest part of the README's test command (the indented line after "Run the tests")."""
    text = (ROOT / 'README.md').read_text()
    match = re.search(r'^Run the tests.*\n\n    (.+)$', text, flags=re.MULTILINE)
    assert match, 'the README has no test command after "Run the tests"'
    command = match.group(1).split('&&')[-1]
    words = shlex.split(command)
    assert words[0] == 'pytest', command
    return words


def test_the_readme_test_command_names_its_number_of_processes() -> None:
    words = readme_test_command()
    assert '-n' in words and words[words.index('-n') + 1].isdigit(), words


def test_ci_runs_the_readme_test_command() -> None:
    command = shlex.join(readme_test_command())
    ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()]
    assert command in ci_lines, f'.ci/run does not run {command!r}'


def test_pytest_settings_do_not_set_the_number_of_processes() -> None:
    settings = (ROOT / 'pyproject.toml').read_text()
    match = re.search(r'^addopts\s*=\s*"([^"]*)"', settings, flags=re.MULTILINE)
    addopts = shlex.split(match.group(1)) if match else []
    assert not any(w == '-n' or w.startswith(('-n', '--numprocesses')) for w in addopts), addopts
    setup = configparser.ConfigParser()
    setup.read(ROOT / 'setup.cfg')
    assert not setup.has_section('tool:pytest')
