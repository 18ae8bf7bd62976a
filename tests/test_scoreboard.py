"""The one scoreboard, with scripted drafters: every drafter's offer (each back by its key,
each of lead's own kinds by name) is compared once with what lead then emitted, kept in one
record per drafter, which the board ranks by and the cost model prices by; a draft posted
a token at a time while lead decodes plainly counts as one outcome. And there is one such
comparison in lead: the scoreboard's."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from bench.fake import FakeModel
from lead.backs.feed import attach
from lead.decode.engine import Engine, GenRequest
from lead.drafts.board import Candidate, DraftBoard
from lead.drafts.own import OWN
from lead.policy.acceptance import draft_outcome
from lead.policy.scoreboard import Offer, Scoreboard, Watch

ROOT = Path(__file__).resolve().parent.parent
Outcome = tuple[int, bool, bool]


def scripted() -> tuple[Scoreboard, dict[str, list[Outcome]]]:
    """A scoreboard whose records note every outcome they take, per drafter."""
    scores, heard = Scoreboard(), {}

    def record(key: str, matches: int, missed: bool, first: bool = False,
               back: bool = True):  # type: ignore[no-untyped-def]
        heard.setdefault(key, []).append((matches, missed, first))
        return Scoreboard.record(scores, key, matches, missed, first, back)
    scores.record = record  # type: ignore[method-assign]
    return scores, heard


def test_draft_outcome_counts_matches_until_the_first_miss() -> None:
    assert draft_outcome([1, 2, 3], [1, 2, 9, 4]) == (2, True)
    assert draft_outcome([1, 2], [1, 2, 3]) == (2, False)  # the draft ran out
    assert draft_outcome([1, 2, 3], [1]) == (1, False)  # lead emitted one token
    assert draft_outcome([5], [1]) == (0, True)


def test_an_offer_is_recorded_once_lead_contradicts_it() -> None:
    scores, heard = scripted()
    scores.offered("s", [1, 2], True, {"b": Offer((7, 8, 9))})
    scores.settle("s", [1, 2, 7])  # one token, agreeing: not settled yet
    assert heard == {}
    scores.settle("s", [1, 2, 7, 5])
    assert heard == {"b": [(1, True, True)]} and scores.watches["s"] == {}


def test_an_offer_that_continues_the_watched_one_extends_it() -> None:
    scores, heard = scripted()
    scores.offered("s", [1], False, {"b": Offer((7,))})
    scores.settle("s", [1, 7])  # used up, not settled: 1 match of a 1-token draft
    scores.offered("s", [1, 7], False, {"b": Offer((8, 9))})  # the back's draft goes on
    scores.settle("s", [1, 7, 8, 9], final=True)
    assert heard == {"b": [(3, False, False)]}


def test_a_used_up_offer_is_recorded_when_a_later_one_comes() -> None:
    scores, heard = scripted()
    scores.offered("s", [1], False, {"b": Offer((7,))})
    scores.settle("s", [1, 7, 3])  # a step emitted 7 and 3: one match, nothing contradicted
    assert heard == {}
    scores.offered("s", [1, 7, 3], False, {"b": Offer((4,))})  # past it: a new offer
    assert heard == {"b": [(1, False, False)]}
    scores.settle("s", [1, 7, 3, 5])
    assert heard == {"b": [(1, False, False), (0, True, False)]}


def test_the_end_of_a_reply_settles_every_watched_offer_and_forgets_the_reply() -> None:
    scores, heard = scripted()
    scores.offered("s", [1], False, {"b": Offer((7, 8, 9)), f"{OWN}:ngram": Offer(
        (7, 8), back=False)})
    scores.settle("s", [1, 7, 8], final=True)
    assert heard == {"b": [(2, False, False)], f"{OWN}:ngram": [(2, False, False)]}
    assert "s" not in scores.watches
    scores.settle("s", [1, 7, 8], final=True)  # nothing left to settle
    assert sum(map(len, heard.values())) == 2


def test_each_session_s_offers_are_settled_against_its_own_tokens() -> None:
    scores, heard = scripted()
    scores.offered("s1", [1], False, {"b": Offer((7, 8))})
    scores.offered("s2", [2], False, {"b": Offer((5,))})
    scores.settle("s2", [2, 6])  # the other session's tokens say nothing of s1's offer
    assert heard == {"b": [(0, True, False)]}
    scores.settle("s1", [1, 7, 8, 0], final=True)
    assert heard["b"][-1] == (2, False, False)  # its draft ran out, none of it contradicted


def test_a_watch_follows_a_draft_that_grows_and_ignores_others() -> None:
    watch = Watch(2, Offer((7,)), True)
    tokens = [0, 0, 7]  # lead emitted the watched token: the draft is used up...
    longer = watch.extended(tokens, Offer((8, 9)))  # ...and the back's next post goes on
    assert longer == Watch(2, Offer((7, 8, 9)), True)
    assert longer.extended([0, 0, 7], Offer((5, 6))) is longer  # another draft: kept
    assert watch.extended([0, 0, 7, 4], Offer((8,))) is watch  # lead went past it
    capped = Watch(2, Offer((7,)), False, limit=4)
    assert capped.extended([0, 0, 7], Offer((8, 9, 1, 2, 3))).offer.tail == (7, 8, 9, 1)


def test_only_backs_set_what_the_cost_model_prices_backs_drafts_by() -> None:
    scores = Scoreboard()
    scores.record(f"{OWN}:ngram", 8, False, back=False)  # lead's own kind: right
    assert scores.leader.alpha == scores.record_of("a back not yet heard").alpha
    scores.record("junk", 0, True)
    scores.record("good", 8, False)
    assert scores.leader is scores.records["good"]  # the best of the backs heard lately


def test_lead_s_kinds_and_backs_are_ranked_by_one_record_each() -> None:
    """A back and lead's `ngram` kind post the same length; the kind is right and the
    back is not: within a few steps the board verifies the kind's drafts."""
    board, tokens = DraftBoard(), [1, 2, 3]
    for _ in range(4):
        n = len(tokens)
        board.post(tokens, Candidate("b", n, (0, 0, 0)))
        board.post(tokens, Candidate(OWN, n, (n + 1, n + 2, n + 3), kind="ngram"))
        board.scores.offered("s", tokens, False, board.offers(tokens))
        chosen = board.best(tokens, 8)
        tokens = [*tokens, n + 1]  # lead emitted one token: the kind's first
        board.scores.settle("s", tokens)
    assert chosen is not None and chosen.back_id == OWN and chosen.drafter == f"{OWN}:ngram"
    assert board.scores.alpha("b") < board.scores.alpha(f"{OWN}:ngram")


def test_drafts_posted_a_token_at_a_time_teach_lead_their_whole_worth() -> None:
    """A back woken for a probe posts a growing draft while lead decodes plainly; every
    draft is right. Compared one emitted token at a time, each offer showed one match and
    alpha stayed under 0.95; followed to its end, each shows up to 8."""
    prompt = [1, 2, 3]
    reference = asyncio.run(_reply(Engine(FakeModel()), prompt, 40, grow=False))
    engine = Engine(FakeModel(), max_draft=8, draft_len=0)  # offers compared, never verified
    assert asyncio.run(_reply(engine, prompt, 40, grow=True, reference=reference)) == reference
    assert engine.cost.alpha > 0.95


async def _reply(engine: Engine, prompt: list[int], n: int, grow: bool,
                 reference: list[int] | None = None) -> list[int]:
    feed = attach(engine)  # what a back would post to
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
    assert posted and engine.cost.scores.leader.rest.right > 0  # its matches up to the stop


# --- one settle site ---

COMPARISONS = {"agreement", "draft_outcome"}  # lead/policy/acceptance.py's: offered vs emitted
DEFINED = "lead/policy/acceptance.py"  # (where one is made of the other)


def compares(path: Path) -> set[str]:
    """The comparisons of a draft with what lead emitted that `path` makes (calls of
    either function), and any method it defines named settle."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in COMPARISONS:
                found.add(name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name in ("settle", "_settle"):
            found.add(node.name)
    return found


def test_lead_compares_what_drafters_offered_with_what_it_emitted_in_one_place() -> None:
    sites = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "lead").rglob("*.py"))
             if (hits := compares(p)) and str(p.relative_to(ROOT)) != DEFINED}
    assert list(sites) == ["lead/policy/scoreboard.py"], sites
    for retired in ("lead/drafts/offers.py", "lead/drafts/rank.py"):
        assert not (ROOT / retired).exists()


def test_the_scan_sees_a_comparison_and_a_settle(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("class A:\n    def _settle(self):\n        return agreement(a, b)\n")
    assert compares(source) == {"_settle", "agreement"}
