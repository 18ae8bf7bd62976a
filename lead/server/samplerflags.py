"""llama-server's sampling flags: what a request that leaves a sampler's field out gets.

Each is off unless given (lead's requests sample as OpenAI's do: no top-k, top-p 1); a
request's own value wins. `--temp` and `--seed` are LeadSettings'.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from shared.cli import cli

SAMPLING = "sampling (a request's own fields win)"


class SamplerFlags(BaseSettings):
    top_k: int | None = Field(None, ge=0, description="top-k (0: off)",
                              json_schema_extra=cli(SAMPLING))
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="top-p, nucleus "
                                "sampling (1: off)", json_schema_extra=cli(SAMPLING))
    min_p: float | None = Field(None, ge=0.0, lt=1.0, description="min-p (0: off)",
                                json_schema_extra=cli(SAMPLING))
    repeat_penalty: float | None = Field(None, ge=0.01, le=100.0, description="llama.cpp's "
                                         "repeat penalty (1: off)",
                                         json_schema_extra=cli(SAMPLING))
    repeat_last_n: int | None = Field(None, ge=-1, description="the repeat penalty's window "
                                      "(-1: the whole context; 0: off)",
                                      json_schema_extra=cli(SAMPLING))
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="OpenAI's "
                                           "presence penalty (0: off)",
                                           json_schema_extra=cli(SAMPLING))
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="OpenAI's "
                                            "frequency penalty (0: off)",
                                            json_schema_extra=cli(SAMPLING))

    def sampler_preset(self) -> dict[str, Any]:
        """The given ones, by the request field each stands for."""
        return {name: getattr(self, name) for name in SamplerFlags.model_fields
                if getattr(self, name) is not None}
