"""Benchmarks that run stock RQ and rq-epoch on the same server in the same run.

One module per question a user asks; each is a command (``python -m benchmarks.<module>``)
with a ``--quick`` mode, prints its section of the report and writes its numbers as JSON
under ``benchmarks/results/``. The shared code is :mod:`benchmarks.harness` (servers,
workers, counting, results), :mod:`benchmarks.fixture` (expired leases in bulk) and
:mod:`benchmarks.report`; the chaos run is :mod:`benchmarks.chaos`. ``python -m benchmarks``
runs them all but ``detection``. See docs/performance.md.
"""
