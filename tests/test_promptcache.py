"""What stays cached between prompts: the slot a prompt takes (a back's: so that little is
pushed out; lead's: the one holding most of it), and prompts' cells kept in host memory
once another prompt pushes them out of their slot, given back to a later prompt that
begins with them (fake models, virtual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.worker import Worker
from bench.fake import FakeModel
from lead.decode.promptcache import PromptCache, Saved
from lead.decode.session import Session
from lead.decode.slots import Seat, choose_seat
from shared.model import reusing_slot
from shared.wire.protocol import SamplingParams, SessionState, Update
from tests.test_slots import engine_over, prompts, reply, run, slotted

SYSTEM = [1 + j % 9 for j in range(20)]
ASKED = (*SYSTEM, *range(30, 90))  # a question and the reply to it: a tool call
RESULT = [*SYSTEM, *range(100, 160)]  # the tool's result sent back: the same system prompt


def test_an_agents_prompts_sharing_only_a_system_prompt_take_a_back_slot_each() -> None:
    cached = [ASKED, (), ()]
    assert reusing_slot(RESULT, cached, [0, 1, 2]) == 1  # 20 kept, 60 lost: an empty slot
    assert reusing_slot([*ASKED[:50], 7], cached, [0, 1, 2]) == 0  # keeps more than it drops
    assert reusing_slot([*ASKED, 7, 8], cached, [1, 2]) == 1  # its own slot busy
    assert reusing_slot(ASKED[:22], cached, [0, 1, 2]) == 0  # asked again: its reply there
    # every slot loses more than it keeps: the one holding least
    assert reusing_slot([9] * 5, [(1,) * 10, (2,) * 4], [0, 1]) == 1


def test_a_back_follows_a_session_on_the_slot_holding_its_prompt() -> None:
    draft = FakeModel(slots=3, salt="draft")
    drafters = [ModelDrafter(draft.slot(i)) for i in range(3)]
    drafters[0].catch_up(ASKED)
    drafters[1].catch_up(RESULT)
    worker = Worker(LeadClient("http://lead"), drafters, None, None)
    sessions = [SessionState(session_id=sid, token_ids=list(prompt), n_tokens=len(prompt),
                             n_prompt=len(prompt), draft_len=2, sampling=SamplingParams())
                for sid, prompt in (("result", RESULT), ("asked", ASKED), ("new", [5] * 9))]
    worker._take(Update(version=1, lead_id="", sessions=sessions))
    assert {sid: f.slot for sid, f in worker.followers.items()} == \
        {"result": 1, "asked": 0, "new": 2}


def saved(tokens: Sequence[int], size: int = 10) -> Saved:
    return Saved(tuple(tokens), bytes(size))


def test_the_longest_shared_prefix_is_found_and_the_least_recently_used_dropped() -> None:
    cache = PromptCache(max_bytes=30, min_tokens=2)
    for tokens in ([1, 2, 3], [1, 2, 9, 9], [7, 7]):
        cache.add(saved(tokens))
    assert cache.match([1, 2, 9, 5]) == (saved([1, 2, 9, 9]), 3)
    assert cache.match([4]) == (None, 0)
    cache.used(saved([1, 2, 3]))  # [1, 2, 9, 9] is now the least recently used
    cache.add(saved([5, 5, 5]))
    assert len(cache) == 3 and cache.bytes == 30
    assert cache.match([1, 2, 9]) == (saved([1, 2, 3]), 2)


def test_what_an_entry_holds_already_is_not_saved_again_and_a_longer_one_replaces_it() -> None:
    cache = PromptCache(max_bytes=100, min_tokens=3)
    assert cache.worth_saving([1, 2, 3, 4], kept=0)
    assert not cache.worth_saving([1, 2, 3, 4], kept=2)  # two lost: not worth an entry
    cache.add(saved([1, 2, 3, 4]))
    assert not cache.worth_saving([1, 2, 3], kept=0)  # the entry holds them
    cache.add(saved([1, 2, 3, 4, 5, 6]))  # it extends the first
    assert len(cache) == 1 and cache.bytes == 10
    cache.add(saved([8] * 5, size=101))  # larger than the whole cache: not kept
    cache.add(saved([9] * 5, size=0))  # the model could not save it
    assert len(cache) == 1
    assert not PromptCache(max_bytes=0).worth_saving([1] * 100, kept=0)  # off


def test_a_prompt_host_memory_holds_more_of_is_loaded_into_the_slot_it_takes() -> None:
    cached = [(1, 2, 3, 9), (4, 4), ()]
    assert choose_seat([1, 2, 3, 4, 5], cached, [0, 1, 2], stored=5) == Seat(0, 3, restored=5)
    assert choose_seat([1, 2, 3, 4, 5], cached, [1, 2], stored=5) == Seat(2, 0, restored=5)
    assert choose_seat([1, 2, 3, 4, 5], cached, [0, 1, 2], stored=3) == Seat(0, 3)  # a tie:
    assert Seat(2, 0, restored=5).keeps == 0 and Seat(0, 3).keeps == 3  # the slot's own


def conversation_turns(engine_cache: int, model: FakeModel) -> list[Session]:
    """Conversation a, then b, which pushes a out of the one slot, then a's next turn."""
    engine = engine_over(model, parallel=1, cache_bytes=engine_cache)
    a, b = prompts(2, 40)

    async def body() -> list[Session]:
        first = await reply(engine, a, 10)
        other = await reply(engine, b, 10)
        return [first, other, await reply(engine, first.tokens + [5, 6, 7], 10)]

    return run(body())  # type: ignore[return-value]


def test_a_conversation_pushed_out_of_its_slot_finds_its_turns_in_host_memory() -> None:
    cached = conversation_turns(1 << 20, slotted(1))
    again = conversation_turns(0, slotted(1))  # off: every prompt evaluated whole
    assert cached[2].prompt_evaluated == 3  # the new user tokens only
    assert again[2].prompt_evaluated == len(again[2].tokens[:again[2].n_prompt]) - 1
    assert [s.tokens for s in cached] == [s.tokens for s in again]


class Refusing(FakeModel):
    def load_slot(self, slot: int, tokens: Sequence[int], state: bytes) -> bool:
        super().load_slot(slot, tokens, b"")
        return False


def test_a_saved_prompt_the_model_refuses_is_evaluated_again(
        caplog: pytest.LogCaptureFixture) -> None:
    model = Refusing(slots=1, eos_bias=-100.0, cost_s=(0.001, 0.0001),
                     clock=slotted(1).clock)
    refused = conversation_turns(1 << 20, model)
    again = conversation_turns(0, slotted(1))
    assert refused[2].prompt_evaluated == again[2].prompt_evaluated
    assert [s.tokens for s in refused] == [s.tokens for s in again]
    assert "refused a saved prompt" in caplog.text


def test_prompts_seated_side_by_side_save_and_restore_each_their_own() -> None:
    model = slotted(2)
    engine = engine_over(model, parallel=2, cache_bytes=1 << 20)
    asked = prompts(6, 30)

    async def body() -> list[Session]:
        await asyncio.gather(*(reply(engine, p, 5) for p in asked))  # 6 through 2 slots
        return list(await asyncio.gather(*(reply(engine, p, 5) for p in asked[:4])))

    again = run(body())
    assert engine.gauges()["prompt_cache_entries"] == len(engine.decoder.prompts) >= 4
    assert all(s.prompt_evaluated == 0 for s in again)  # type: ignore[union-attr]


def test_a_long_shared_prefix_is_measured_to_the_token() -> None:
    cache = PromptCache(max_bytes=100)
    system = list(range(1000))
    cache.add(saved([*system, 1, 2]))
    for n in (0, 255, 256, 257, 999, 1000):
        assert cache.match([*system[:n], -1])[1] == n
    assert cache.match([*system, 1, 2, 3])[1] == 1002
