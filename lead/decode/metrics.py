"""Lead's counters, and the console line it logs per reply (/metrics: lead/server/prometheus.py)."""

from __future__ import annotations

from dataclasses import dataclass

from lead.decode.session import Session


@dataclass
class Metrics:
    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    prompt_evaluated: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    steps: int = 0
    decode_seconds: float = 0.0
    drafts_posted: int = 0
    drafts_stale: int = 0
    drafts_invalid: int = 0
    drafts_untrusted: int = 0  # posts from backs without the back key: their dists dropped
    link_updates: int = 0  # updates pushed to backs on the link
    steps_after_rejection: int = 0  # verify steps whose previous step (same reply) rejected
    ready_after_rejection: int = 0  # of those, the ones that found a draft on the board
    branch_drafts: int = 0  # verify steps whose draft came from a branch
    clients_cut: int = 0  # connections cut off: their client read nothing for --write-timeout

    def count_cut(self) -> None:
        self.clients_cut += 1

    def record_session(self, s: Session, now: float) -> None:
        self.requests += 1
        self.prompt_tokens += s.n_prompt
        self.prompt_evaluated += s.prompt_evaluated
        self.generated_tokens += s.n_generated
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.rejections += s.rejections
        self.steps += s.steps
        self.decode_seconds += max(now - s.t_decode, 0.0) if s.t_decode else 0.0

    def record_step(self, after_rejection: bool, ready: bool, from_branch: bool) -> None:
        """Count a verify step: whether the step before it in the reply rejected a draft
        token, whether a draft was ready for it, whether the one it verifies is a branch."""
        self.steps_after_rejection += after_rejection
        self.ready_after_rejection += after_rejection and ready
        self.branch_drafts += from_branch

    @staticmethod
    def session_line(s: Session, now: float) -> str:
        prefill = (s.t_decode or now) - s.t_start
        decode = max(now - s.t_decode, 1e-9) if s.t_decode else 0.0
        rate = s.n_generated / decode if decode else 0.0
        share = f" ({100 * s.accepted / s.drafted:.0f}%)" if s.drafted else ""
        return (f"prompt {s.n_prompt} tokens ({s.prompt_evaluated} evaluated) in {prefill:.2f} s"
                f" | {s.n_generated} tokens decoded in {decode:.2f} s ({rate:.1f} tok/s)"
                f" | drafted {s.drafted} accepted {s.accepted}{share} | {s.finish_reason}")
