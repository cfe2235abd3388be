"""A shared cache of the exporter's rendered views: each read from the server at most once per period.

Every load of the page reads the server (what ``rq-epoch status`` reads, a dry-run sweep
included), and each open browser reloads it every refresh period: without a cache, twenty
people watching cost the server twenty reads per period. :class:`RenderCache` keeps each
view (``/``, ``/job/<id>``) for ``ttl`` seconds after it was rendered, and renders a view
once however many requests want it at the same moment (single flight): the first request
renders, the others wait for its result instead of reading the server themselves. A render
that raises is shared with the requests that waited for it, and is not kept.

The entries are bounded (``max_entries``; the job pages are keyed by job id, so a caller can
name any number of them): when a render adds one entry too many, the oldest rendered goes.
Expired entries go first, whenever a view is rendered.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ['DEFAULT_MAX_ENTRIES', 'CacheStats', 'RenderCache']

#: Views kept at most (the status page and job pages together).
DEFAULT_MAX_ENTRIES = 256

T = TypeVar('T')


@dataclass(frozen=True)
class CacheStats:
    """What a :class:`RenderCache` did since it was made."""

    #: Views rendered (each one read of the server).
    renders: int
    #: Requests answered with a view rendered earlier, still fresh.
    hits: int
    #: Requests that waited for a render in progress and were answered with its result.
    shared: int
    #: Requests waiting for a render in progress right now.
    waiting: int
    #: Entries held right now.
    entries: int


class _Entry(Generic[T]):
    """One view: rendered (``done`` set) or being rendered."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None
        self.expires = 0.0


class RenderCache(Generic[T]):
    """Views kept ``ttl`` seconds, rendered once per key at a time; thread-safe.

    ``ttl`` 0 is no cache at all: every request renders, each on its own.
    """

    def __init__(
        self, ttl: float, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl < 0:
            raise ValueError(f'ttl must be 0 or more, got {ttl}')
        if max_entries < 1:
            raise ValueError(f'max_entries must be at least 1, got {max_entries}')
        self.ttl = float(ttl)
        self.max_entries = int(max_entries)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._renders = self._hits = self._shared = self._waiting = 0

    def get(self, key: str, render: Callable[[], T]) -> T:
        """The view ``key``: kept, being rendered by another request (waited for), or rendered now.

        Raises whatever ``render`` raised, to every request that waited for that render.
        """
        if self.ttl <= 0:
            with self._lock:
                self._renders += 1
            return render()
        with self._lock:
            now = self._clock()
            entry = self._entries.get(key)
            if entry is not None and entry.done.is_set() and entry.expires <= now:
                entry = None  # expired: render again
            if entry is None:
                entry = _Entry()
                self._entries[key] = entry
                self._entries.move_to_end(key)
                self._renders += 1
                self._trim(now)
                leader = True
            else:
                leader = False
                if entry.done.is_set():
                    self._hits += 1
                else:
                    self._waiting += 1
        if leader:
            return self._render(key, entry, render)
        if not entry.done.is_set():
            entry.done.wait()
            with self._lock:
                self._waiting -= 1
                self._shared += 1
        if entry.error is not None:
            raise entry.error
        return entry.value  # type: ignore[return-value]  # set before done, when there is no error

    def _render(self, key: str, entry: _Entry[T], render: Callable[[], T]) -> T:
        try:
            entry.value = render()
            return entry.value
        except BaseException as exc:
            entry.error = exc
            raise
        finally:
            with self._lock:
                entry.expires = self._clock() + self.ttl
                if entry.error is not None and self._entries.get(key) is entry:
                    del self._entries[key]
            entry.done.set()

    def _trim(self, now: float) -> None:
        """Drop expired entries, then the oldest rendered while there are too many (under the lock)."""
        for key in [k for k, e in self._entries.items() if e.done.is_set() and e.expires <= now]:
            del self._entries[key]
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)  # a render in progress keeps its entry for its waiters

    def stats(self) -> CacheStats:
        """Counts of renders, hits and shared renders so far, and what is held now."""
        with self._lock:
            return CacheStats(self._renders, self._hits, self._shared, self._waiting, len(self._entries))

    def clear(self) -> None:
        """Forget every view kept (renders in progress still answer their waiters)."""
        with self._lock:
            self._entries.clear()
