"""While the model loads, lead's sockets answer llama-server's 503 "Loading model"
(lead/server/loading.py), and are handed on still listening."""

from __future__ import annotations

import socket

import httpx

from lead.server.loading import Loading
from lead.server.serve import bound_socket


def test_every_request_while_loading_is_llama_server_s_503_and_the_socket_lives_on() -> None:
    with bound_socket("127.0.0.1", 0) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with Loading([sock]):
            health = httpx.get(f"{url}/health", timeout=5)
            posted = httpx.post(f"{url}/v1/chat/completions", json={"messages": []}, timeout=5)
            with socket.create_connection(sock.getsockname(), timeout=5) as silent:
                silent.sendall(b"GET /health HTTP/1.1\r\n")  # half a request: answered anyway
                assert silent.recv(64).startswith(b"HTTP/1.1 503")
        assert health.status_code == posted.status_code == 503
        assert health.json()["error"] == {"code": 503, "message": "Loading model",
                                          "type": "unavailable_error"}
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass  # still listening after: queued for the server that takes the socket over
