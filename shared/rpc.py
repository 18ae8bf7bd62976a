"""python -m shared.rpc: serve this machine's GPU (or CPU) to a lead or back over llama.cpp RPC.

The same server as llama.cpp's `rpc-server`, started from the llama-cpp-python a pip install
built, so a second machine needs no other toolchain.
"""

from __future__ import annotations

import os
import signal
import sys

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.cli import fail, parse_settings

DESCRIPTION = ("duo RPC server: serves this machine's GPU, or its CPU where it has none, to "
               "a lead or back started with --rpc HOST:PORT --n-gpu-layers N. llama.cpp RPC "
               "has no authentication and no encryption: keep it on a private network or "
               "behind an SSH tunnel.")
LOCAL = ("127.0.0.1", "localhost", "::1")


class RpcSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RPC_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on (anything but loopback "
                      "lets every machine that reaches it run code on this one)")
    port: int = Field(50052, ge=1, le=65535, description="port to listen on")
    threads: int = Field(0, ge=0, description="CPU threads when serving the CPU (0: one per "
                         "CPU)")
    cache: str | None = Field(None, description="directory to cache tensors in, so a client "
                              "that reconnects loads the model faster")


def warning(host: str) -> str:
    if host in LOCAL:
        return ("note: llama.cpp RPC has no authentication; this server is reachable from "
                "this machine only (use an SSH tunnel to reach it from another)")
    return (f"WARNING: listening on {host}: llama.cpp RPC has no authentication and no "
            "encryption; anyone who reaches this port can use this machine. Use it on a "
            "private network only, or bind 127.0.0.1 and connect through an SSH tunnel.")


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(RpcSettings, "python -m shared.rpc", DESCRIPTION, argv)
    from shared import crashtrace
    from shared.llama import ggml  # loads llama.cpp: after --help and flag errors

    crashtrace.install()

    if not ggml.rpc_supported():
        fail(f"this llama-cpp-python has no RPC backend; {ggml.REBUILD}")
    if settings.cache:
        os.makedirs(settings.cache, exist_ok=True)
    print(warning(settings.host), file=sys.stderr, flush=True)
    endpoint = f"{settings.host}:{settings.port}"
    print(f"serving {', '.join(ggml.served_device_names())} on {endpoint}", flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the server loop is C: let Ctrl-C end it
    ggml.start_rpc_server(endpoint, settings.cache, settings.threads or os.cpu_count() or 1)
    fail(f"the RPC server on {endpoint} stopped: llama.cpp says why above (port in use? "
         "an address this machine does not have?)")


if __name__ == "__main__":
    main(sys.argv[1:])
