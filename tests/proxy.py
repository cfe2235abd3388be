"""A loopback TCP proxy that can hold one write on its way to the server, or cut a reply.

The fencing tests need a stale execution's commit to be *in flight*: sent by the worker
after every check the worker makes, but not yet applied by the server, while a sweep takes
the lease and a newer execution runs. The proxy forwards everything, except that once
armed with a byte pattern it stops forwarding the first connection whose client sends
those bytes, holds what it sent, and forwards it only when the test releases it.

The take tests need the opposite: a command the server *has* applied, whose reply never
reaches the client. Armed with :meth:`HoldingProxy.cut`, the proxy forwards the first write
that contains the pattern, then closes that connection (both sides) when the server's
reply arrives, instead of forwarding it. Armed with :meth:`HoldingProxy.drop`, it closes the
connection of the first write that contains the pattern without forwarding it: the server
never sees that command, and the client sees its connection drop.

The failover tests put it on a replica's replication link (the replica connects to the
primary through it) and hold what the server sends with :meth:`HoldingProxy.hold_downstream`:
from then on, the primary acknowledges writes that the replica never receives, until it is
promoted without them.
"""

from __future__ import annotations

import socket
import threading

__all__ = ['HoldingProxy']


class HoldingProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>``; hold on request."""

    def __init__(self, upstream_port: int, hold_limit: float = 60.0) -> None:
        self.upstream_port = upstream_port
        self.hold_limit = hold_limit
        self._listener = socket.create_server(('127.0.0.1', 0))
        self.port: int = self._listener.getsockname()[1]
        #: The pattern each action ('hold', 'cut', 'drop') waits for, until it fires once.
        self._patterns: dict[str, bytes] = {}
        self._lock = threading.Lock()
        #: Set when a connection was closed in place of forwarding a reply.
        self.cut_done = threading.Event()
        #: Set when a connection was closed in place of forwarding a write (:meth:`drop`).
        self.drop_done = threading.Event()
        #: Set when a connection sent the pattern and its bytes are being held.
        self.held = threading.Event()
        self._released = threading.Event()
        self._sockets: list[socket.socket] = []
        self._closed = False
        #: Cleared while what the server sends is held (:meth:`hold_downstream`).
        self._downstream_open = threading.Event()
        self._downstream_open.set()
        #: Set once a held chunk was on its way to the client.
        self.downstream_held = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f'redis://127.0.0.1:{self.port}/0'

    def hold(self, pattern: bytes) -> None:
        """Hold the first client write that contains ``pattern`` (once)."""
        with self._lock:
            self._patterns['hold'] = pattern
            self.held.clear()
            self._released.clear()

    def cut(self, pattern: bytes) -> None:
        """Drop the reply to the first client write that contains ``pattern`` (once), and
        close that connection."""
        with self._lock:
            self._patterns['cut'] = pattern
            self.cut_done.clear()

    def drop(self, pattern: bytes) -> None:
        """Close the connection of the first client write that contains ``pattern`` (once),
        without forwarding that write: the command never reaches the server."""
        with self._lock:
            self._patterns['drop'] = pattern
            self.drop_done.clear()

    def hold_downstream(self) -> None:
        """From now on, forward nothing the server sends, on any connection, until
        :meth:`release_downstream` (or :meth:`close`, which drops what was held)."""
        self.downstream_held.clear()
        self._downstream_open.clear()

    def release_downstream(self) -> None:
        """Forward what the server sent while held, and everything after it."""
        self._downstream_open.set()

    def release(self) -> None:
        """Forward the held write (and what followed it on that connection)."""
        self._released.set()

    def close(self) -> None:
        self._closed = True
        self._released.set()
        self._downstream_open.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(('127.0.0.1', self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            cut_reply = threading.Event()
            threading.Thread(target=self._client_to_server, args=(client, upstream, cut_reply), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(upstream, client, cut_reply), daemon=True).start()

    def _fires(self, action: str, tail: bytes, chunk: bytes) -> bool:
        """Whether ``action``'s pattern is in this write (with the end of the one before); an
        action fires once."""
        with self._lock:
            pattern = self._patterns.get(action)
            if pattern is None or pattern not in tail + chunk:
                return False
            del self._patterns[action]
        return True

    def _client_to_server(self, client: socket.socket, upstream: socket.socket, cut_reply: threading.Event) -> None:
        tail = b''
        try:
            while True:
                chunk = client.recv(65536)
                if not chunk:
                    break
                if self._fires('drop', tail, chunk):
                    self.drop_done.set()
                    break  # not forwarded: both sides are closed below
                if self._fires('cut', tail, chunk):
                    cut_reply.set()  # before the server can answer
                if self._fires('hold', tail, chunk):
                    self.held.set()
                    self._released.wait(self.hold_limit)
                tail = chunk[-256:]
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            _shutdown(client, upstream)

    def _server_to_client(self, source: socket.socket, target: socket.socket, cut_reply: threading.Event) -> None:
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                if cut_reply.is_set():  # the reply to the cut command: close instead
                    self.cut_done.set()
                    break
                if not self._downstream_open.is_set():
                    self.downstream_held.set()
                    self._downstream_open.wait(self.hold_limit)
                    if self._closed:
                        break  # dropped: the client never gets it
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            _shutdown(source, target)


def _shutdown(*sockets: socket.socket) -> None:
    """End both directions of each socket, so the pump on the other side ends too."""
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
