"""llama-server's serving and logging flags that lead takes under their names: each does
what it does there, or is accepted saying why it changes nothing here."""

from __future__ import annotations

import json

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from shared.cli import cli, readable_file

SERVING, LOG = "serving", "logging"
# -lv: llama-server's verbosity thresholds as lead's log levels
VERBOSITY = {0: "error", 1: "error", 2: "warning", 3: "info", 4: "debug", 5: "debug"}


def thinking_switch(kwargs: str) -> bool | None:
    """--chat-template-kwargs' enable_thinking (None: not given); ValueError for JSON that
    is not an object, or for an argument lead's templates do not take."""
    try:
        parsed = json.loads(kwargs)
    except ValueError:
        raise ValueError("not JSON: give an object, e.g. '{\"enable_thinking\": false}'") \
            from None
    if not isinstance(parsed, dict):
        raise ValueError("a JSON object, e.g. '{\"enable_thinking\": false}'")
    other = sorted(set(parsed) - {"enable_thinking"})
    if other or not isinstance(parsed.get("enable_thinking", False), bool):
        raise ValueError(f"lead's templates take enable_thinking (true or false) only, not "
                         f"{', '.join(other) or repr(parsed['enable_thinking'])}")
    return parsed.get("enable_thinking")


class ServeFlags(BaseSettings):
    props: bool = Field(False, description="POST /props answers (llama-server's: it changes "
                        "no property there either); without it, its 501",
                        json_schema_extra=cli(SERVING))
    api_key_file: str | None = Field(None, description="a file of API keys, one a line ('#' "
                                     "starts a comment), each admitted as --api-key is",
                                     json_schema_extra=cli(SERVING))
    ssl_key_file: str | None = Field(None, description="serve HTTPS with this PEM key "
                                     "(with --ssl-cert-file)", json_schema_extra=cli(SERVING))
    ssl_cert_file: str | None = Field(None, description="serve HTTPS with this PEM "
                                      "certificate (with --ssl-key-file)",
                                      json_schema_extra=cli(SERVING))
    log_file: str | None = Field(None, description="log to this file too",
                                 json_schema_extra=cli(LOG))
    log_disable: bool = Field(False, description="log errors only (llama-server's: nothing)",
                              json_schema_extra=cli(LOG))
    verbosity: int | None = Field(None, ge=0, le=5, description="llama-server's log "
                                  "threshold: 0-1 errors, 2 warnings, 3 info, 4-5 debug "
                                  "(as --log-level)",
                                  json_schema_extra=cli(LOG, "-lv", "--log-verbosity"))
    warmup: bool = Field(True, description="llama-server's empty warm-up run: lead's "
                         "startup pricing runs the model anyway (--no-calibrate skips "
                         "that), so this is accepted and changes nothing",
                         json_schema_extra=cli(SERVING))
    threads_http: int = Field(0, ge=0, description="llama-server's HTTP threads: lead's "
                              "HTTP is one event loop that never waits on the model, so this "
                              "is accepted and changes nothing", json_schema_extra=cli(SERVING))

    log_timestamps: bool = Field(True, description="lead's log lines always carry the "
                                 "time: accepted, changing nothing", json_schema_extra=cli(LOG))
    log_prefix: bool = Field(True, description="lead's log lines always name their source "
                             "and level: accepted, changing nothing",
                             json_schema_extra=cli(LOG))
    log_colors: str = Field("auto", pattern="^(on|off|auto)$", description="lead's log is "
                            "plain text: on, off or auto accepted, changing nothing",
                            json_schema_extra=cli(LOG, bare="on"))
    perf: bool = Field(True, description="llama.cpp's own timing report: lead times each "
                       "reply itself (the log, a reply's timings), so --no-perf changes "
                       "nothing", json_schema_extra=cli(LOG))
    keep: int = Field(0, ge=-1, description="tokens a context shift keeps: lead shifts no "
                      "context, so this is accepted and changes nothing",
                      json_schema_extra=cli(SERVING))
    slot_prompt_similarity: float = Field(0.1, ge=0.0, le=1.0, description="llama-server's "
                                          "least prompt likeness for choosing a slot by it: "
                                          "lead always takes the free slot sharing the "
                                          "longest prefix, so this changes nothing",
                                          json_schema_extra=cli(SERVING, "-sps"))
    cache_idle_slots: bool = Field(True, description="an idle slot's cells go to host "
                                   "memory when the slot is taken (lead always does, as "
                                   "--cache-ram allows; --cache-ram 0: never)",
                                   json_schema_extra=cli(SERVING))
    reasoning_budget: int = Field(-1, ge=-1, description="a thinking model's reasoning "
                                  "budget, as llama-server's: -1 none, 0 reasoning off (as "
                                  "--reasoning off); lead cuts no reasoning at a count",
                                  json_schema_extra=cli(SERVING))
    chat_template_kwargs: str | None = Field(None, description="the template's arguments, as "
                                             "JSON: lead's templates take enable_thinking (as "
                                             "--reasoning on/off)",
                                             json_schema_extra=cli(SERVING))

    @field_validator("cache_idle_slots")
    @classmethod
    def _idle(cls, value: bool) -> bool:
        if not value:
            raise ValueError("lead always keeps an idle slot's cells when the slot is "
                             "taken; --cache-ram 0 keeps none")
        return value

    @field_validator("reasoning_budget")
    @classmethod
    def _budget(cls, value: int) -> int:
        if value > 0:
            raise ValueError("lead ends no reasoning at a token budget: -1 (none) or 0 "
                             "(reasoning off)")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs(cls, value: str | None) -> str | None:
        if value is not None:
            thinking_switch(value)
        return value

    @field_validator("api_key_file", "ssl_key_file", "ssl_cert_file")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        return readable_file(value)

    def api_keys(self) -> list[str]:
        """--api-key-file's keys, in order (comments and blank lines skipped)."""
        if self.api_key_file is None:
            return []
        with open(self.api_key_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        return [line for line in lines if line and not line.startswith("#")]

    def logging_level(self, level: str, verbose: bool) -> str:
        """The level lead logs at: --verbose, -lv or --log-disable over --log-level."""
        if verbose:
            return "debug"
        if self.verbosity is not None:
            return VERBOSITY[self.verbosity]
        return "error" if self.log_disable else level
