"""Benchmarks that run stock RQ and rq-epoch on the same server in the same run.

One module per question; each is a command (``python -m benchmarks.<module>``) with a
``--quick`` mode, prints a small table and writes its numbers as JSON under
``benchmarks/results/``. ``python -m benchmarks`` runs them all. See docs/performance.md.
"""
