"""A real Prometheus server for the tests, and the shipped alert rules with their time compressed.

:class:`PrometheusServer` runs Debian's ``prometheus`` on a free loopback port with its own data
folder, scraping and evaluating every second, and reads its HTTP API (``/api/v1/alerts``,
``/api/v1/query``, ``/api/v1/rules``). :func:`compress_rules` writes a copy of the shipped rules
whose durations are divided by a factor -- the ``for:`` of each rule, the ranges of its
expression and the seconds it compares an age with -- and nothing else, so the expressions the
test runs are the shipped ones with smaller numbers.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import wait_for

_UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400}
_DURATION = re.compile(r'(\d+)([smhd])')
#: A range selector: ``[15m]``.
_RANGE = re.compile(r'\[(\d+[smhd])\]')
#: An age in seconds compared with a threshold: ``time() - metric > 300``.
_AGE = re.compile(r'(time\(\) - [a-z_]+ > )(\d+)')


def seconds(duration: str) -> int:
    """A Prometheus duration (``5m``, ``90s``, ``1h30m``) in seconds."""
    parts = _DURATION.findall(duration)
    assert parts and ''.join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNITS[u] for n, u in parts)


def _scaled(duration: str, factor: int) -> str:
    return f'{max(1, seconds(duration) // factor)}s'


def compress_rules(source: Path, dest: Path, factor: int) -> dict[str, dict[str, Any]]:
    """Write ``source``'s rules to ``dest`` with every duration divided by ``factor``; return them by alert name."""
    doc = yaml.safe_load(source.read_text())
    rules: dict[str, dict[str, Any]] = {}
    for group in doc['groups']:
        for rule in group['rules']:
            shipped = rule['expr']
            if 'for' in rule:
                rule['for'] = _scaled(rule['for'], factor)
            expr = _RANGE.sub(lambda m: f'[{_scaled(m.group(1), factor)}]', shipped)
            expr = _AGE.sub(lambda m: f'{m.group(1)}{max(1, int(m.group(2)) // factor)}', expr)
            # Only numbers change: the expression is the shipped one.
            assert _numbers_out(expr) == _numbers_out(shipped), (shipped, expr)
            rule['expr'] = expr
            rules[rule['alert']] = rule
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return rules


def _numbers_out(expr: str) -> str:
    """An expression with each number and duration replaced by ``#``."""
    return re.sub(r'\d+(?:[smhd](?![a-z_]))?', '#', expr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """``prometheus`` on loopback, scraping ``targets`` every second and evaluating ``rule_files``."""

    def __init__(self, binary: str, folder: Path, targets: list[str], rule_files: list[Path]) -> None:
        self.binary = binary
        self.folder = folder
        self.config = folder / 'prometheus.yml'
        self.config.write_text(
            yaml.safe_dump(
                {
                    'global': {'scrape_interval': '1s', 'evaluation_interval': '1s', 'scrape_timeout': '1s'},
                    'rule_files': [str(path) for path in rule_files],
                    'scrape_configs': [
                        {'job_name': 'rq-epoch', 'metrics_path': '/metrics', 'static_configs': [{'targets': targets}]}
                    ],
                }
            )
        )
        self.log = folder / 'prometheus.log'
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ''

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        """Start on a free port (another one if that port was taken meanwhile) and wait until ready."""
        for _ in range(3):
            port = free_port()
            argv = [
                self.binary,
                f'--config.file={self.config}',
                f'--storage.tsdb.path={self.folder / "data"}',
                f'--web.listen-address=127.0.0.1:{port}',
                '--log.level=warn',
            ]
            with open(self.log, 'ab') as log:
                self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.url = f'http://127.0.0.1:{port}'
            deadline = time.monotonic() + timeout
            while self.process.poll() is None and time.monotonic() < deadline:
                if self._ready():
                    return self
                time.sleep(0.1)
            if self.process.poll() is None:
                self.stop()
                raise AssertionError(f'prometheus not ready within {timeout}s: {self.log.read_text()[-2000:]}')
            if 'address already in use' not in self.log.read_text():
                raise AssertionError(f'prometheus exited: {self.log.read_text()[-2000:]}')
        raise AssertionError('prometheus found no free port in 3 tries')

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + '/-/ready', timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL by PID after 15 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(15)

    def api(self, path: str, **params: str) -> Any:
        url = f'{self.url}/api/v1/{path}'
        if params:
            url += '?' + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            doc = json.load(response)
        assert doc['status'] == 'success', doc
        return doc['data']

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: each series' labels and value."""
        data = self.api('query', query=expr)
        assert data['resultType'] == 'vector', data
        return [(item['metric'], float(item['value'][1])) for item in data['result']]

    def value(self, expr: str) -> float | None:
        """The value of a query with one series, None when it has none."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return result[0][1] if result else None

    def alerts(self, name: str, state: str = 'firing', **labels: str) -> list[dict[str, Any]]:
        """Alerts called ``name`` in ``state`` (``pending`` or ``firing``) whose labels include ``labels``."""
        return [
            alert
            for alert in self.api('alerts')['alerts']
            if alert['labels']['alertname'] == name
            and alert['state'] == state
            and all(alert['labels'].get(k) == v for k, v in labels.items())
        ]

    def last_evaluation(self) -> float:
        """The oldest last evaluation of a rule group, as a Unix time (0 before the first)."""
        stamps = []
        for group in self.api('rules')['groups']:
            stamp = group.get('lastEvaluation', '')
            stamps.append(_unix(stamp) if stamp and not stamp.startswith('0001') else 0.0)
        return min(stamps, default=0.0)

    def wait_firing(self, name: str, since: float, timeout: float = 60.0, **labels: str) -> float:
        """Wait until alert ``name`` fires; the seconds from ``since`` (``time.time()``) to the poll that saw it."""
        wait_for(lambda: self.alerts(name, **labels), timeout, interval=0.2, what=f'alert {name} {labels} firing')
        return time.time() - since


def _unix(stamp: str) -> float:
    """An RFC 3339 time from Prometheus's API (nanoseconds cut to microseconds) as a Unix time."""
    from datetime import datetime

    match = re.fullmatch(r'(.*?T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)', stamp)
    assert match, stamp
    fraction = (match.group(2) or '.0')[:7]
    zone = '+00:00' if match.group(3) == 'Z' else match.group(3)
    return datetime.fromisoformat(match.group(1) + fraction + zone).timestamp()
