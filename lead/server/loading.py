"""While the model loads: every request on lead's sockets gets llama-server's 503 "Loading
model", so that a script or a service manager polling /health sees lead up and waits,
instead of a refused connection it may take for a failure. The sockets stay bound and
listening; uvicorn takes them over as they are, a connection still queued included."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading

BODY = json.dumps({"error": {"code": 503, "message": "Loading model",
                             "type": "unavailable_error"}}).encode()
RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(BODY)).encode() + b"\r\nConnection: close\r\n\r\n"
            + BODY)
HEAD_LIMIT = 1 << 16  # bytes of a request read before answering (its body is not needed)


class Loading:
    """Answers 503 on `sockets` from `start()` until `stop()` (then returns at once)."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="lead-loading", daemon=True)

    def __enter__(self) -> Loading:
        for sock in self._sockets:
            sock.listen(128)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            for sock in self._sockets:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.05):
                    _answer(key.fileobj)  # type: ignore[arg-type]


def _answer(listener: socket.socket) -> None:
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, OSError):
        return
    with conn:
        conn.settimeout(1.0)  # a client that sends nothing does not hold the load up
        for step in (_read_head, lambda c: c.sendall(RESPONSE)):  # answered even so
            with contextlib.suppress(OSError):
                step(conn)


def _read_head(conn: socket.socket) -> None:
    seen = b""
    while b"\r\n\r\n" not in seen and len(seen) < HEAD_LIMIT:
        chunk = conn.recv(4096)
        if not chunk:
            return
        seen += chunk
