"""A loopback TCP proxy a test can cut: the server 'dies' mid-answer, deterministically.

Clients connect to the proxy, which forwards bytes both ways to the real server. `cut()`
closes every connection at once (the client sees the stream break, as when the server is
killed), and new connections are forwarded again afterwards (the server 'restarted').
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from chatapp.benchmark.server_process import free_port


class CutProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._forwarded = bytearray()
        self._forwarded_changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True, name="cut-proxy").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink, sink is client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, to_client: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                if to_client:
                    with self._forwarded_changed:
                        self._forwarded += data
                        self._forwarded_changed.notify_all()
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def wait_until_forwarded(self, pattern: re.Pattern[bytes], timeout: float) -> bool:
        """Wait until the bytes passed on to clients match `pattern`: a cut after it cannot beat them."""
        with self._forwarded_changed:
            return self._forwarded_changed.wait_for(lambda: pattern.search(self._forwarded) is not None, timeout)

    def cut(self) -> None:
        """Break every open connection (both ways), as a killed server would."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for end in sockets:
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


@contextmanager
def cut_proxy(target_port: int) -> Iterator[CutProxy]:
    proxy = CutProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
