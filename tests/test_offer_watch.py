"""Lead learns what drafts are worth from offers it does not verify, over several steps."""

from __future__ import annotations

import asyncio

from lead.backs.feed import attach
from lead.decode.engine import Engine, GenRequest
from lead.drafts.offers import OfferWatch
from lead.policy.acceptance import draft_outcome
from shared.fake import FakeModel


def test_draft_outcome_counts_matches_until_the_first_miss() -> None:
    assert draft_outcome([1, 2, 3], [1, 2, 9, 4]) == (2, True)
    assert draft_outcome([1, 2], [1, 2, 3]) == (2, False)  # the draft ran out
    assert draft_outcome([1, 2, 3], [1]) == (1, False)  # lead emitted one token
    assert draft_outcome([5], [1]) == (0, True)


def test_watch_settles_on_a_miss_its_limit_or_the_end() -> None:
    watch = OfferWatch(start=3, token_ids=(7, 8, 9), first=False, limit=3)
    assert watch.outcome([0, 0, 0, 7]) is None  # one token emitted, it agreed: wait
    assert watch.outcome([0, 0, 0, 7, 5]) == (1, True)
    assert watch.outcome([0, 0, 0, 7, 8, 9]) == (3, False)
    assert watch.outcome([0, 0, 0, 7], final=True) == (1, False)  # the reply ended
    used_up = OfferWatch(start=3, token_ids=(7,), first=False, limit=3)
    assert used_up.used_up([0, 0, 0, 7]) and used_up.outcome([0, 0, 0, 7]) is None


def test_watch_follows_a_draft_that_grows_and_ignores_others() -> None:
    watch = OfferWatch(start=2, token_ids=(7,), first=True)
    tokens = [0, 0, 7]  # lead emitted the watched token: the draft is used up...
    longer = watch.extended(tokens, [8, 9])  # ...and the back's next post goes on
    assert longer == OfferWatch(2, (7, 8, 9), True)
    assert longer.extended([0, 0, 7], [5, 6]) is longer  # another draft: kept
    assert watch.extended([0, 0, 7, 4], [8]) is watch  # lead went on past it: not its draft
    capped = OfferWatch(2, (7,), False, limit=4)
    assert capped.extended([0, 0, 7], [8, 9, 1, 2, 3]).token_ids == (7, 8, 9, 1)


def test_drafts_posted_a_token_at_a_time_teach_lead_their_whole_worth() -> None:
    """A back woken for a probe posts a growing draft while lead decodes plainly; every
    draft is right. Compared one emitted token at a time, each offer showed one match and
    alpha stayed under 0.95; followed to its end, each shows up to 8."""
    target = FakeModel()
    prompt = [1, 2, 3]
    reference = asyncio.run(_reply(Engine(FakeModel()), prompt, 40, grow=False))
    engine = Engine(target, max_draft=8, draft_len=0)  # offers are compared, never verified
    assert asyncio.run(_reply(engine, prompt, 40, grow=True, reference=reference)) == reference
    assert engine.cost.acceptance.alpha > 0.95


async def _reply(engine: Engine, prompt: list[int], n: int, grow: bool,
                 reference: list[int] | None = None) -> list[int]:
    feed = attach(engine)
    async for _ in engine.generate(GenRequest(prompt_ids=list(prompt), max_tokens=n)):
        s = engine.session
        if grow and reference and s is not None and not s.done:
            at = s.n_generated
            feed.post_draft(s.id, len(s.tokens), reference[at: at + 1 + s.steps % 3], None,
                            "back")
    assert engine.session is not None
    return engine.session.tokens[len(prompt):]


def test_a_stop_string_ending_the_reply_still_scores_the_watched_offer() -> None:
    prompt = [1, 2, 3]
    reference = asyncio.run(_reply(Engine(FakeModel()), prompt, 40, grow=False))
    text = "".join(FakeModel().token_bytes(t).decode("latin-1") for t in reference)
    stop = text[12:15]
    assert text.find(stop) == 12  # the reply stops at token 15, mid-way through the draft
    engine = Engine(FakeModel(), max_draft=8, draft_len=0)
    feed = attach(engine)
    posted = False

    async def run() -> None:
        nonlocal posted
        request = GenRequest(prompt_ids=list(prompt), max_tokens=40, stop=[stop])
        async for _ in engine.generate(request):
            s = engine.session
            if s is not None and not s.done and s.n_generated == 10 and not posted:
                feed.post_draft(s.id, len(s.tokens), reference[10:18], None, "back")
                posted = True

    asyncio.run(run())
    assert posted and engine.cost.acceptance.rest.right > 0  # its matches up to the stop count
