"""Adapters: the one place where rq-epoch touches RQ's and redis-py's internals.

An adapter is a small, named, documented function (or class) that stands for one use of a
library's private attribute, of a method or class replaced at run time, or of behaviour the
library does not promise. The rule: no other module of rq-epoch does any of that; it calls
the adapter. Where a library offers a supported hook, rq-epoch uses the hook, and no
adapter is needed.

``rq_epoch.adapters.rq`` holds RQ's, ``rq_epoch.adapters.redis_py`` redis-py's. Each
contact is listed in docs/design.md with the reason no public hook serves, and guarded by
a test in tests/test_adapters.py that fails when the library moves.
"""
