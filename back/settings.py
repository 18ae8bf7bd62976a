"""The back's settings: CLI flags and BACK_* environment variables come from here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.cli import ApiKey
from shared.context import check_context
from shared.devicesettings import DeviceChecks
from shared.placement import parse_cpus
from shared.wire.httpclient import check_lead
from shared.wire.protocol import MAX_BRANCHES


class BackSettings(DeviceChecks):
    model_config = SettingsConfigDict(env_prefix="BACK_", extra="ignore")

    lead: str = Field("127.0.0.1:5555", description="lead's address, host[:port] (port "
                      "5555 where none is given) or http(s)://host:port")
    model: str = Field("qwen2.5-coder-0.5b", description="draft GGUF path or preset name",
                       json_schema_extra={"short": "m"})
    drafter: Literal["model", "ngram"] = Field("model", description="model: a draft model; "
                                               "ngram: prompt lookup, no model needed")
    threads: int = Field(0, ge=0, description="CPU threads for the draft model (0: one per "
                         "CPU the back drafts on)")
    cpus: str = Field("auto", description="auto: on lead's host, the CPUs lead does not use, "
                      "or idle priority on one thread where it uses them all; elsewhere every "
                      "CPU. 'all': every CPU. Or a list, e.g. 2-3")
    n_gpu_layers: int = Field(0, ge=-1, description="layers to offload to GPUs and --rpc "
                              "servers (-1: all)")
    rpc: str | None = Field(None, description="llama.cpp RPC servers host:port[,host:port] "
                            "(python -m shared.rpc) that take the draft's --n-gpu-layers")
    tensor_split: str | None = Field(None, description="weights of the offloaded layers per "
                                     "device, in order (--rpc servers, then local GPUs), e.g. 3,1")
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto", description="llama.cpp's flash attention; auto: on where layers are offloaded "
        "(--n-gpu-layers) or several generations share the cache, off for one on a CPU, where "
        "it made long verify batches 7-50 % dearer at 1-2k tokens of context")
    ctx_size: int = Field(0, ge=0, description="draft model context size in tokens, per "
                          "session drafted for (0: as lead chooses its own: 32768, or less "
                          "where the model or memory allow less)")
    slots: int = Field(4, ge=1, le=64, description="lead's sessions drafted for at once, "
                       "their next guesses in one model call (lead's --parallel, 4 by "
                       "default; more are not followed)")
    batch_size: int = Field(512, ge=1, description="tokens per batch when catching up")
    max_ahead: int = Field(16, ge=1, le=64, description="most tokens drafted ahead of lead")
    branches: int = Field(8, ge=0, le=MAX_BRANCHES, description="most branches grown beside "
                          "the draft, each the draft's runner-up where lead likely rejects "
                          "it and a draft after it, ready at once if lead emits that token; "
                          "as many as the draft's measured cost leaves time for in lead's "
                          "step (none on a CPU core where a wider batch costs more; 0: off)")
    send_dists: bool = Field(True, description="post each draft token's sampling distribution "
                             "(exact rejection sampling at temperature > 0; off: lead "
                             "verifies by sample-and-compare)")
    blind: bool = Field(False, description="for benchmarks: draft without the request's "
                        "grammar (lead still enforces it), to measure what drafting under it "
                        "gains")
    api_key: ApiKey = Field(None, description="lead's API key, if it requires one")
    back_id: str = Field("", max_length=64, description="name shown to lead (default: host-pid)")
    log_level: str = Field("info", pattern="^(?i)(debug|info|warning|error)$",
                           description="debug, info, warning or error")

    @field_validator("lead")
    @classmethod
    def _lead_address(cls, value: str) -> str:
        """Refused here, an address no retry could reach is a one-line error at startup."""
        check_lead(value)
        return value

    @field_validator("ctx_size")
    @classmethod
    def _context(cls, value: int) -> int:
        return check_context(value)

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: str) -> str:
        if value not in ("auto", "all"):
            parse_cpus(value)
        return value
