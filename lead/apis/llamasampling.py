"""llama-server's sampling fields beyond OpenAI's (DRY, XTC, mirostat, typical_p,
min_keep), as /v1/chat/completions, /v1/completions, /completion and /infill take them:
llama-server's names and defaults; a value out of range is a 400 naming the field. What
they do: shared/sampling.py (the chain, in llama-server's order), shared/samplers.py,
shared/dry.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.wire.protocol import DRY_BREAKERS, Count, DryBreakers, DryLastN, Share, Strength

DRY_BASE = 1.75  # llama-server's; a dry_base below 1 gets it, as there


class LlamaSamplers(BaseModel):
    dry_multiplier: Strength = 0.0
    dry_base: float = Field(DRY_BASE, le=100.0, allow_inf_nan=False)
    dry_allowed_length: Count = 2
    dry_penalty_last_n: DryLastN = -1
    dry_sequence_breakers: DryBreakers = Field(default_factory=lambda: list(DRY_BREAKERS))
    typical_p: Share = 1.0
    min_keep: Count = 0
    xtc_probability: Share = 0.0
    xtc_threshold: Share = 0.1
    mirostat: Literal[0, 1, 2] = 0
    mirostat_tau: Strength = 5.0
    mirostat_eta: Share = 0.1

    def llama_sampling(self) -> dict[str, Any]:
        """The fields as SamplingParams takes them."""
        out = {name: getattr(self, name) for name in FIELDS}
        out["dry_base"] = self.dry_base if self.dry_base >= 1.0 else DRY_BASE
        return out


FIELDS = tuple(LlamaSamplers.model_fields)


class LlamaSamplersAsGiven(BaseModel):
    """/infill's and /completion's: passed on as given, for the completion request to check
    (it names the field at fault)."""

    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_penalty_last_n: Any = None
    dry_sequence_breakers: Any = None
    typical_p: Any = None
    min_keep: Any = None
    xtc_probability: Any = None
    xtc_threshold: Any = None
    mirostat: Any = None
    mirostat_tau: Any = None
    mirostat_eta: Any = None
