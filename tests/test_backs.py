"""Lead's side of the backs (lead/backs/) sits above the engine: drafting imports nothing of
it, the engine tells it three events and knows no feed, and each run holds its own board."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from bench.fake import FakeModel
from lead.backs.feed import attach
from lead.decode.engine import Engine, GenRequest
from lead.decode.runs import Run
from tests.test_layers import imported

ROOT = Path(__file__).resolve().parent.parent


def importers_of(prefix: str, *folders: str) -> set[str]:
    return {f"{path.relative_to(ROOT)}: {name}" for folder in folders
            for path in (ROOT / folder).glob("*.py") for name in imported(path)
            if name == prefix or name.startswith(prefix + ".")}


def test_lead_backs_exists_and_drafting_imports_nothing_of_it() -> None:
    assert (ROOT / "lead/backs/feed.py").is_file()
    assert importers_of("lead.backs", "lead/drafts", "lead/policy") == set()


def test_the_engine_knows_no_feed() -> None:
    for name in ("engine.py", "runs.py", "events.py"):
        path = ROOT / "lead/decode" / name
        assert not any(n.startswith("lead.backs") for n in imported(path)), name
        assert "feed" not in path.read_text().lower(), name


class Heard:
    """A listener noting the engine's events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def step_began(self, price: float | None) -> None:
        self.events.append(("step", price))

    def sessions_changed(self, runs: Sequence[Run]) -> None:
        self.events.append(("changed", [r.session.id for r in runs]))

    def session_ended(self, run: Run) -> None:
        self.events.append(("ended", run.session.id))


def test_the_engine_tells_a_step_s_price_sessions_changed_and_a_session_s_end() -> None:
    engine = Engine(FakeModel(eos_bias=-100.0), max_draft=4, draft_len=2)
    heard = Heard()
    engine.events.subscribe(heard)

    async def reply() -> str:
        async for e in engine.generate(GenRequest(prompt_ids=[1, 2, 3], max_tokens=5)):
            if e.session is not None:
                return e.session.id
        raise AssertionError("no last emission")
    sid = asyncio.run(reply())
    kinds = [kind for kind, _ in heard.events]
    assert heard.events[0] == ("changed", [sid])  # it started
    assert ("ended", sid) in heard.events and kinds.count("ended") == 1
    assert any(kind == "step" and isinstance(price, float) for kind, price in heard.events)
    assert heard.events[-2:] == [("step", None), ("changed", [sid])]  # the loop's last news
    assert ("changed", [sid]) in heard.events[1:-1]  # a step's tokens, told as the next began


def test_a_back_s_post_lands_on_the_run_s_own_board() -> None:
    engine = Engine(FakeModel(eos_bias=-100.0), max_draft=4, draft_len=2)
    feed = attach(engine)
    boards: list[bool] = []

    async def reply() -> None:
        async for _ in engine.generate(GenRequest(prompt_ids=[1, 2, 3], max_tokens=6)):
            run = engine.runs[0] if engine.runs else None
            if run is not None and not boards:
                feed.post_draft(run.session.id, len(run.session.tokens), [7], None, "b")
                boards.append(feed.board_of(run.session.id) is run.board)
                boards.append(bool(run.board.candidates))
    asyncio.run(reply())
    assert boards == [True, True]
    assert feed.followed == {} and len(feed.ended) == 1  # the end was heard
