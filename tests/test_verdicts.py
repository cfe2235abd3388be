"""A verdict is one enum member that still reads, compares, hashes and serialises as its name."""

from __future__ import annotations

import json
import logging

import pytest

from rq_epoch import Verdict
from rq_epoch.ops.metrics import SWEPT_VERDICTS


def test_verdicts_in_report_order() -> None:
    assert [v.value for v in Verdict] == [
        'ghost',
        'corrupt',
        'settled',
        'exempt',
        'stopping',
        'recovered',
        'dead',
        'deferred',
    ]
    assert SWEPT_VERDICTS == ('ghost', 'corrupt', 'settled', 'exempt', 'stopping', 'recovered', 'dead')


@pytest.mark.parametrize('verdict', list(Verdict))
def test_a_verdict_behaves_as_its_name(verdict: Verdict) -> None:
    name = verdict.value
    assert verdict == name
    assert Verdict(name) is verdict
    assert {name: 1}[verdict] == 1
    assert {verdict: 1}[name] == 1
    assert f'{verdict}' == str(verdict) == name
    assert json.loads(json.dumps({verdict: [verdict]})) == {name: [name]}
    assert verdict.wording.startswith(name)
    assert verdict.level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


def test_what_each_verdict_means() -> None:
    assert {v for v in Verdict if v.counted} == {Verdict.RECOVERED, Verdict.DEAD}
    assert {v for v in Verdict if v.uncounted} == {Verdict.EXEMPT, Verdict.STOPPING, Verdict.DEFERRED}
    assert [v for v in Verdict if not v.judged] == [Verdict.DEFERRED]
    assert Verdict.DEAD.level == logging.ERROR
    assert Verdict.DEFERRED.level == logging.DEBUG


def test_an_unknown_verdict_is_refused() -> None:
    with pytest.raises(ValueError):
        Verdict('lost')
