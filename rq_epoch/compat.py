"""Every difference between the RQ versions rq-epoch supports (3.0 and 2.12), in one place.

The rest of the package imports what differs from here instead of testing versions itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ['RQ_KEY_PREFIX', 'text']

try:  # RQ 3.0 made the key prefix configurable
    from rq.defaults import RQ_KEY_PREFIX
except ImportError:  # RQ 2.x: fixed prefix
    RQ_KEY_PREFIX = 'rq'


def text(value: Any) -> str:
    """A server reply as text: bytes decoded (undecodable bytes replaced), None as ``''``.

    RQ's ``rq.utils.as_text`` refuses anything but bytes and str and raises on bad UTF-8;
    replies read for reports and views must not.
    """
    if value is None:
        return ''
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)
