"""A branch: another way a draft may go from one of its tokens on."""

from __future__ import annotations

from dataclasses import dataclass

from shared.sampling import Dist


@dataclass(frozen=True)
class Branch:
    """`token_ids` in place of a draft's own from index `at` on: token_ids[0], the root,
    differs from the draft's token there (its next likeliest), the rest are drafted after
    it; `dists`: the distribution each was drawn from, where the drafter gives them.
    Lead's board keeps branches, its verifier checks them beside the draft, a back grows
    them; the wire carries them as DraftBranch (shared/wire/protocol.py)."""

    at: int
    token_ids: tuple[int, ...]
    dists: tuple[Dist, ...] | None = None
