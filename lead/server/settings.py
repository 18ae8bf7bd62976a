"""The lead's settings: CLI flags and LEAD_* environment variables come from here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from lead.server.llamaflags import LlamaServerFlags
from lead.server.samplerflags import SamplerFlags
from lead.server.serveflags import ServeFlags, thinking_switch
from shared.cli import ApiKey, check_api_key, cli
from shared.context import check_context, slot_share
from shared.devicesettings import DeviceChecks
from shared.placement import parse_cpus

MIN_MEMORY = 1024  # tokens: the smallest --ngram-memory but 0
# --help's sections; llama-server's names for a flag are given beside lead's
MODEL, SERVING, SPECULATION, BACKS = "model and devices", "serving", "speculation", "backs"


def _layers(value: object) -> object:
    """-ngl as llama-server takes it: a number, or 'all' (-1)."""
    if value == "all":
        return -1
    if value == "auto":
        raise ValueError("'auto' sizes offloading to free memory in llama-server; lead "
                         "cannot: give a number of layers or 'all'")
    return value


# llama-server's names for values: -ngl all, -n -1 (no limit)
GpuLayers = Annotated[int, BeforeValidator(_layers)]
Predict = Annotated[int, BeforeValidator(lambda v: 0 if str(v) == "-1" else v)]
Seed = Annotated[int | None, BeforeValidator(lambda v: None if str(v) == "-1" else v)]


def parse_costs(text: str) -> list[float]:
    """'1.6,2.1' -> [1.6, 2.1]; ValueError naming what is wrong."""
    try:
        costs = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"not a list of numbers: {text!r} (e.g. 1.6,2.1,2.4)") from None
    if not costs or not all(0 < c < 1000 for c in costs):
        raise ValueError(f"costs are positive numbers under 1000: {text!r}")
    return costs


class LeadSettings(LlamaServerFlags, SamplerFlags, ServeFlags, DeviceChecks):
    model_config = SettingsConfigDict(env_prefix="LEAD_", extra="ignore")

    model: str = Field("qwen2.5-coder-1.5b", description="GGUF path or preset name "
                       "(qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m)",
                       json_schema_extra=cli(MODEL, "-m"))
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every "
                      "interface; give --api-key there, or anyone who reaches the port uses "
                      "lead)",
        json_schema_extra=cli(SERVING))
    port: int = Field(5555, ge=1, le=65535, description="port to listen on",
        json_schema_extra=cli(SERVING))
    threads: int = Field(0, ge=0, description="CPU threads for the target (0: one per CPU "
                         "lead runs on)",
        json_schema_extra=cli(MODEL, "-t"))
    cpus: str = Field("all", description="CPUs to run on, e.g. 0-3 ('all': every CPU this "
                      "process may use); a back on this host drafts on the others",
        json_schema_extra=cli(MODEL))
    n_gpu_layers: GpuLayers = Field(0, ge=-1, description="layers to offload to GPUs and --rpc "
                              "servers (-1: all)",
        json_schema_extra=cli(MODEL, "-ngl", "--gpu-layers"))
    rpc: str | None = Field(None, description="llama.cpp RPC servers host:port[,host:port] "
                            "(python -m shared.rpc) that take the target's --n-gpu-layers",
        json_schema_extra=cli(MODEL))
    tensor_split: str | None = Field(None, description="weights of the offloaded layers per "
                                     "device, in order (--rpc servers, then local GPUs), e.g. 3,1",
        json_schema_extra=cli(MODEL, "-ts"))
    flash_attn: Literal["auto", "on", "off"] = Field("auto", description="llama.cpp's flash "
                                                    "attention; auto: on where layers are "
                                                    "offloaded (--n-gpu-layers) or several "
                                                    "generations share the cache, off for one "
                                                    "on a CPU, where it made long verify "
                                                    "batches 7-50 % "
                                                    "dearer at 1-2k tokens of context",
        json_schema_extra=cli(MODEL, "-fa", bare="on"))
    ctx_size: int = Field(0, ge=0, description="tokens the KV cache holds, as llama-server's "
                          "-c: each of --parallel slots holds its share (all of it with "
                          "--kv-unified, where lead keeps that for every slot); 0: "
                          "--ctx-per-slot's, or lead's choice: 32768 a slot, enough for a "
                          "coding agent's prompt, or less where the model was trained for "
                          "less or the cache would take over a quarter of memory (logged)",
        json_schema_extra=cli(MODEL, "-c"))
    ctx_per_slot: int = Field(0, ge=0, description="tokens one generation holds, the cache "
                              "holding --parallel times as many (llama-server's "
                              "--kv-unified-per-slot); with --ctx-size, the smaller of the two",
        json_schema_extra=cli(MODEL, "--kv-unified-per-slot"))
    batch_size: int = Field(512, ge=1, description="tokens per batch when evaluating a prompt",
        json_schema_extra=cli(MODEL, "-b"))
    ubatch_size: int = Field(0, ge=0, description="tokens per llama.cpp compute step within "
                             "a batch (0: --batch-size)",
                             json_schema_extra=cli(MODEL, "-ub"))
    threads_batch: int = Field(0, ge=0, description="CPU threads for prompt batches (0: "
                               "--threads)", json_schema_extra=cli(MODEL, "-tb"))
    alias: str | None = Field(None, description="the model's name in replies and /v1/models "
                              "(default: the GGUF's file name)",
                              json_schema_extra=cli(MODEL, "-a"))
    jinja: bool = Field(True, description="render the chat template as Jinja (--no-jinja: "
                        "through llama.cpp's built-in templates, as llama-server without "
                        "--jinja; no tools then)",
                        json_schema_extra=cli(MODEL))
    mlock: bool = Field(False, description="keep the model's weights in RAM (mlock)",
                        json_schema_extra=cli(MODEL))
    mmap: bool = Field(True, description="map the model file (--no-mmap: read it whole)",
                       json_schema_extra=cli(MODEL))
    max_draft: int = Field(8, ge=0, le=64, description="most draft tokens verified per step",
        json_schema_extra=cli(SPECULATION, "--spec-draft-n-max"))
    ngram: bool = Field(True, description="lead's own drafts, model-free: what followed the "
                        "longest earlier match of the reply's last tokens in the prompt and "
                        "reply, verified where the cost model says they pay (edits, code "
                        "echoed back); backs' drafts compete with them",
        json_schema_extra=cli(SPECULATION))
    ngram_max: int = Field(64, ge=1, le=64, description="most tokens of one of lead's own "
                           "drafts",
        json_schema_extra=cli(SPECULATION))
    ngram_memory: int = Field(65536, ge=0, le=1 << 20, description="tokens of finished "
                              "prompts and replies lead's own drafts also copy from, so that "
                              "a reply asked for again, regenerated or repeated by an agent "
                              "drafts from the last (0: none, else at least 1024; ~300 bytes "
                              "of memory a token; every client's replies draft for every "
                              "other's, which speed alone can show)",
        json_schema_extra=cli(SPECULATION))
    draft_len: int | None = Field(None, ge=0, le=64,
                                  description="fixed draft length (default: cost-aware, measured)",
        json_schema_extra=cli(SPECULATION))
    verify_cost: str | None = Field(None, description="verify costs given instead of "
                                    "measured: a batch of 2, 3, ... tokens over one token, "
                                    "e.g. 1.1,1.2,1.3 (later sizes go on by the last step); "
                                    "for a machine already measured, and for tests ('2,3': "
                                    "drafts never pay; '1': they always do)",
        json_schema_extra=cli(SPECULATION))
    calibrate: bool = Field(True, description="price verify batches of 1..max-draft+1 tokens "
                            "at startup (seconds on a CPU), so drafts are verified at the "
                            "length that pays from the first reply",
        json_schema_extra=cli(SPECULATION))
    parallel: int = Field(4, ge=1, le=64, description="generations decoded at once, in one "
                          "batch a step, each drafted for (slots sharing --ctx-size)",
                          json_schema_extra=cli(SERVING, "-np"))
    cache_reuse: int = Field(0, ge=0, description="llama-server's least prefix chunk reused "
                             "by shifting the cache: lead always reuses a cached prefix (its "
                             "own slot's, another's or host memory's) and shifts nothing, so "
                             "this is accepted and changes nothing", json_schema_extra=cli(SERVING))
    webui: bool = Field(True, description="serve the web page at / (--no-webui: not)",
                        json_schema_extra=cli(SERVING, "--ui"))
    metrics: bool = Field(True, description="serve Prometheus metrics at /metrics (always on "
                          "unless --no-metrics; llama-server's --metrics is accepted)",
                          json_schema_extra=cli(SERVING))
    cache_ram: int = Field(8192, ge=0, description="MiB of host memory for the KV cells of "
                           "prompts pushed out of their slot by another, given back to a later "
                           "prompt that begins with one (a conversation's next turn, a system "
                           "prompt sent again) instead of evaluated again; the least recently "
                           "used go first (0: off). As llama-server's --cache-ram",
        json_schema_extra=cli(SERVING, "-cram"))
    max_queue: int = Field(8, ge=0, description="requests that may wait behind the running "
                           "ones; more get 429",
        json_schema_extra=cli(SERVING))
    max_tokens: Predict = Field(0, ge=0, description="max_tokens of a request that gives none "
                            "(0: up to the context's end, as llama-server and the official "
                            "APIs do: agents such as Codex send none, and take a reply cut "
                            "short for a failure)",
        json_schema_extra=cli(SERVING, "-n", "--n-predict", "--predict"))
    temp: float = Field(0.0, ge=0.0, le=2.0, description="the temperature of a request that "
                        "gives none (0: greedy; llama-server's --temp)",
                        json_schema_extra=cli(SERVING))
    seed: Seed = Field(None, description="the sampling seed of a request that gives none "
                       "(-1 or unset: a new one each request)",
                       json_schema_extra=cli(SERVING, "-s"))
    api_key: ApiKey = Field(None, description="require 'Authorization: Bearer KEY'",
        json_schema_extra=cli(SERVING))
    back_key: ApiKey = Field(None, description="the key that makes a back trusted: its draft "
                             "probabilities count (exact rejection sampling); a back without it "
                             "(but with --api-key) is verified as if its drafts were chosen, "
                             "not sampled (default: the API key)",
        json_schema_extra=cli(BACKS))
    write_timeout: float = Field(10.0, gt=0, le=600, description="seconds a client may read "
                                 "nothing of its reply while lead has more to send; then its "
                                 "generation is cancelled and its place freed",
        json_schema_extra=cli(SERVING, "-to", "--timeout"))
    max_grammar_s: float = Field(1.0, gt=0, description="most seconds of grammar work per "
                                 "token a constrained reply may take; one over it ends there "
                                 "(finish_reason length) with a warning",
        json_schema_extra=cli(SERVING))
    cors_origins: str = Field("local", description="web pages (origins) whose scripts may "
                              "call lead from a browser, comma-separated, e.g. "
                              "https://chat.example.com: 'local' or llama-server's "
                              "'localhost' (pages served from this machine: localhost, "
                              "127.0.0.1, [::1], any port), '*' (any page: anyone whose "
                              "browser can reach lead can use it), or '' "
                              "(none). A key, where lead has one, is needed all the same",
        json_schema_extra=cli(SERVING))
    max_body_kb: int = Field(1024, ge=1, description="largest request body accepted, in KiB",
        json_schema_extra=cli(SERVING))
    max_draft_posts: float = Field(500.0, gt=0, description="draft posts per second allowed "
                                   "from one back, and four backs' worth from one address "
                                   "(more get 429)",
        json_schema_extra=cli(BACKS))
    log_level: str = Field("info", pattern="^(?i)(debug|info|warning|error)$",
                           description="debug, info, warning or error",
        json_schema_extra=cli(SERVING))


    @field_validator("ctx_size", "ctx_per_slot")
    @classmethod
    def _context(cls, value: int) -> int:
        return check_context(value)

    @model_validator(mode="after")
    def _shares(self) -> LeadSettings:
        slot_share(self.ctx_size, self.ctx_per_slot, self.parallel, self.unified)
        return self

    @model_validator(mode="after")
    def _reasoning_switches(self) -> LeadSettings:
        """llama-server's other ways to say --reasoning: a budget of 0 and the template's
        enable_thinking."""
        switch = thinking_switch(self.chat_template_kwargs) \
            if self.chat_template_kwargs else None
        if self.reasoning_budget == 0 or switch is False:
            self.reasoning = "off"
        elif switch:
            self.reasoning = "on"
        return self

    @model_validator(mode="after")
    def _tls_and_keys(self) -> LeadSettings:
        if (self.ssl_key_file is None) != (self.ssl_cert_file is None):
            raise ValueError("--ssl-key-file and --ssl-cert-file go together")
        for key in self.api_keys():
            check_api_key(key)
        return self

    @property
    def unified(self) -> bool:
        """-kvu as llama-server reads it: as given, else on where --parallel is not given
        (its -np auto: four slots that may each fill the cache)."""
        if "kv_unified" in self.model_fields_set:
            return self.kv_unified
        return "parallel" not in self.model_fields_set

    @property
    def first_api_key(self) -> str | None:
        """--api-key, else --api-key-file's first: whether clients need a key at all."""
        return self.api_key or next(iter(self.api_keys()), None)

    @property
    def slot_ctx(self) -> int:
        """The tokens a slot holds (0: lead chooses, shared/context.py)."""
        return slot_share(self.ctx_size, self.ctx_per_slot, self.parallel, self.unified)

    @field_validator("verify_cost")
    @classmethod
    def _costs(cls, value: str | None) -> str | None:
        if value:
            parse_costs(value)
        return value

    @field_validator("ngram_memory")
    @classmethod
    def _memory(cls, value: int) -> int:
        if 0 < value < MIN_MEMORY:  # a session keeps a quarter: a few hundred tokens of a
            # prompt's end and a reply's start are what anchor a reply asked for again
            raise ValueError(f"0 (none) or at least {MIN_MEMORY} tokens")
        return value

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: str) -> str:
        if value != "all":
            parse_cpus(value)
        return value
