"""A TCP proxy in front of a real Redis that cuts the client's connection when a request
carries a given command, a set number of times: the "Redis blinked mid-command" fault, made
to happen exactly where a test wants it (a restart lands wherever the scheduler puts it)."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to ``target``; the first ``cuts`` requests that contain
    ``command`` (its RESP bytes, e.g. b"LPUSH") are not forwarded: the client's socket is closed
    with a reset instead, so it sees the connection drop as after a Redis kill."""

    def __init__(self, target: tuple[str, int], command: bytes, cuts: int) -> None:
        self.target, self.command, self.left = target, command, cuts
        self.cut = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target)
                threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()

    def _take_cut(self, data: bytes) -> bool:
        with self._lock:
            if self.left and self.command in data:
                self.left, self.cut = self.left - 1, self.cut + 1
                return True
            return False

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._take_cut(data):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
                upstream.sendall(data)
        client.close()
        upstream.close()

    @staticmethod
    def _replies(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
        client.close()

    def close(self) -> None:
        self._listener.close()
