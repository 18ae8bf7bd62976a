"""llama.cpp RPC endpoints: parsing `--rpc` lists and checking a server answers.

llama.cpp aborts the whole process when a server it registers cannot be reached or does
not answer its HELLO, and waits forever on one that accepts but never answers (an RPC
server serves one client at a time). So each server is greeted here first, in Python,
with a timeout: a problem becomes a one-line error naming the server.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

HELLO = 14  # RPC_CMD_HELLO: fixed across protocol versions
CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: zero caps ask for plain TCP
PROTOCOL_MAJOR = 7  # what llama-cpp-python 0.3.36's llama.cpp speaks
MAX_REPLY = 1024  # a HELLO reply is 28 bytes; more means another protocol


class RpcError(ValueError):
    """An RPC endpoint that is malformed, unreachable or speaks another protocol."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(spec: str) -> list[Endpoint]:
    """`host:port[,host:port...]`; duplicates are an error (one server, one registration)."""
    endpoints = [parse_endpoint(part.strip()) for part in spec.split(",") if part.strip()]
    if not endpoints:
        raise RpcError("--rpc: no server given (host:port[,host:port...])")
    if len(set(endpoints)) != len(endpoints):
        raise RpcError(f"--rpc: a server is listed twice in {spec!r}")
    return endpoints


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RpcError(f"--rpc: {text!r} is not host:port")
    return Endpoint(host.strip("[]"), int(port))


def hello(endpoint: Endpoint, timeout: float = 5.0) -> tuple[int, int, int]:
    """Greet the server as llama.cpp does; its protocol version, or RpcError saying why not."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
            size, = struct.unpack("<Q", _read(sock, 8))
            reply = _read(sock, size) if size <= MAX_REPLY else b""
    except TimeoutError:
        raise RpcError(f"RPC server {endpoint} did not answer within {timeout:g} s (an RPC "
                       "server serves one client at a time: is a lead or back using it?)"
                       ) from None
    except OSError as exc:
        raise RpcError(f"cannot reach RPC server {endpoint}: {exc.strerror or exc}") from None
    return _version(endpoint, reply)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def _version(endpoint: Endpoint, reply: bytes) -> tuple[int, int, int]:
    if len(reply) < 3:
        raise RpcError(f"{endpoint} is not a llama.cpp RPC server (a {len(reply)}-byte reply)")
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != PROTOCOL_MAJOR:
        raise RpcError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this "
                       f"llama.cpp speaks {PROTOCOL_MAJOR}.x (run the same llama.cpp version "
                       "on both sides)")
    return major, minor, patch


def parse_weights(spec: str) -> list[float]:
    """`--tensor-split 3,1`: how much of the offloaded layers each device takes."""
    try:
        weights = [float(part) for part in spec.split(",")]
    except ValueError:
        raise RpcError(f"--tensor-split: {spec!r} is not a list of numbers like 3,1") from None
    if any(w < 0 for w in weights) or not any(weights):
        raise RpcError(f"--tensor-split: {spec!r} needs non-negative weights, one above zero")
    return weights
