"""llama.cpp's `timings` object of a reply (pure): its prompt's tokens found cached and
evaluated, its reply's, milliseconds and rates; its drafts where there were any."""

from __future__ import annotations

from typing import Any

from lead.decode.session import Session


def timings(session: Session, now: float) -> dict[str, Any]:
    """`now` on the engine's clock, which stamped the session."""
    decoding = session.t_decode or now
    prompt_n, prompt_ms = session.n_prompt - session.n_cached, (decoding - session.t_start) * 1000
    predicted_n, predicted_ms = session.n_generated, (now - decoding) * 1000
    out = {"cache_n": session.n_cached, **rates("prompt", prompt_n, prompt_ms),
           **rates("predicted", predicted_n, predicted_ms)}
    if session.drafted:
        out.update(draft_n=session.drafted, draft_n_accepted=session.accepted)
    return out


def rates(kind: str, n: int, ms: float) -> dict[str, Any]:
    ms = max(ms, 0.0)
    return {f"{kind}_n": n, f"{kind}_ms": ms,
            f"{kind}_per_token_ms": ms / n if n else 0.0,
            f"{kind}_per_second": 1e3 * n / ms if ms > 0 else 0.0}
