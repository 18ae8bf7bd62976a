"""What the real tier's drafting tests share: where lead and back run, and a prompt whose
reply a back can hold.

SmolLM2 drafting for itself is exactly as fast as lead, so on a fresh reply a back only keeps
pace and lead seldom finds a draft ready; whether it does depends on the machine (on a fast
CPU, never). What holds on every machine: asked again, the back already holds the reply in
its KV cache and posts it far ahead. That lasts as long as lead's second reply follows its
first, and lead's batched verification can break a near-tie the other way than decoding one
token at a time (by up to 0.28 nats here), so the prompt is one whose reply leads its
runner-up by more than that almost everywhere (SmolLM2 Q4_1, greedy: 0.48 nats at the
least over 120 tokens, one position under 0.5; the code prompt of test_real.py has 9).
Lead's draft length is forced (`FORCED`): the cost model's judgement of the test machine
is tested with fakes at fixed prices, not here. Its own drafts are off there: these tests
are about a back's, and at a forced length lead's copies would be verified beside them
(lead's own are tested apart, in test_real.py).
"""

from __future__ import annotations

import os

HELD_PROMPT = "List the numbers from 1 to 30, one per line."
FORCED = ("--draft-len", "4", "--no-ngram")


def roles() -> tuple[str | None, str | None]:
    """CPUs for lead and for the back: one each, as on two devices (none to pin on a machine
    with a single CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    return (str(cpus[0]), str(cpus[1])) if len(cpus) >= 2 else (None, None)
