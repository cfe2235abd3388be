"""The ``rq-epoch`` command."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """rq-epoch: restart-aware stall accounting for RQ."""
