"""``python -m benchmarks.chaos [options]`` and ``python -m benchmarks.chaos sweeper ...``."""

from .cli import main

raise SystemExit(main())
