"""A stand-in for llama.cpp's llama-server in tests: the flags the bench passes, /health,
and /v1/chat/completions streamed in llama-server's shape (b11434): text chunks, a last
choice with finish_reason, then a chunk with usage, no choices, and `timings`.

Run as `python tests/fake_llama_server.py FLAGS...`; each start and each request is
appended as a JSON line to the file $FAKE_LLAMA_SERVER_LOG.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# One piece may hold several tokens' text, and one token none: what is counted is timings
PIECES = ["```python\n", "def edited(x):", "\n", "    return x + 1\n", "```"]
PREDICTED_N = 11
DRAFT_N, DRAFT_ACCEPTED = 8, 6


def record(entry: dict) -> None:
    with open(os.environ["FAKE_LLAMA_SERVER_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def chunks(argv: list[str]) -> list[dict]:
    drafting = "--spec-default" in argv or "-md" in argv
    timings = {"predicted_n": PREDICTED_N, "predicted_per_second": 50.0,
               **({"draft_n": DRAFT_N, "draft_n_accepted": DRAFT_ACCEPTED} if drafting else {})}
    text = [{"choices": [{"index": 0, "finish_reason": None, "delta": {"content": piece}}]}
            for piece in PIECES]
    return [{"choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant"}}]},
            *text, {"choices": [{"index": 0, "finish_reason": "length", "delta": {}}]},
            {"choices": [], "usage": {"completion_tokens": PREDICTED_N}, "timings": timings}]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        record({"body": body})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks(sys.argv):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    record({"argv": sys.argv[1:], "pid": os.getpid()})
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
