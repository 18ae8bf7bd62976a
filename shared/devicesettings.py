"""The checks lead's and the back's settings share: where a model's layers run."""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings

from shared.wire.rpc_endpoints import parse_endpoints, parse_weights


class DeviceChecks(BaseSettings):
    """A service's settings with `rpc` (llama.cpp RPC servers) and `tensor_split` (the
    layers' shares) fields: each checked as the model loader will parse it."""

    @field_validator("rpc", check_fields=False)
    @classmethod
    def _endpoints(cls, value: str | None) -> str | None:
        if value:
            parse_endpoints(value)
        return value

    @field_validator("tensor_split", check_fields=False)
    @classmethod
    def _weights(cls, value: str | None) -> str | None:
        if value:
            parse_weights(value)
        return value
