"""Several choices of one request (OpenAI's `n`): one generation each, side by side in the
slots (one batch a step decodes them all), their emissions merged as they come, each
tagged with its choice's index. A seeded request's choice i samples with seed + i, so
that choices differ and each is reproducible; greedy choices are alike, as OpenAI's are.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace

from lead.decode.session import Emission, GenRequest


def choice_requests(req: GenRequest, n: int) -> list[GenRequest]:
    """The generation of each choice: the first in the slot the request names, if it names
    one, the others where they fit (llama-server's children take other free slots)."""
    seed = req.params.seed
    others = replace(req, slot=None)
    if n == 1 or seed is None:
        return [req, *[others] * (n - 1)]
    return [replace(req if i == 0 else others,
                    params=req.params.model_copy(update={"seed": seed + i}))
            for i in range(n)]


async def interleaved(gens: Sequence[AsyncGenerator[Emission, None]]
                 ) -> AsyncGenerator[Emission, None]:
    """Each generation's emissions as they come, tagged with its index (`choice`). Closing
    this closes them all: their generations end."""
    if len(gens) == 1:
        async for e in gens[0]:
            yield e
        return
    waiting = {asyncio.ensure_future(anext(gen)): i for i, gen in enumerate(gens)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=waiting.__getitem__):
                i = waiting.pop(task)
                try:
                    emission = task.result()
                except StopAsyncIteration:
                    continue
                waiting[asyncio.ensure_future(anext(gens[i]))] = i
                yield replace(emission, choice=i)
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for gen in gens:
            await gen.aclose()
