"""Lead's samplers against llama.cpp's own, through the bindings: the same logits in, the
same candidates and probabilities out. Typical, top-p, min-p and XTC (with min_keep), the
whole chain in llama-server's order, mirostat 1.0 and 2.0 step after step (mu following
llama.cpp's own picks), DRY over a history; DRY's sequence breakers with a real
vocabulary in the real tier."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import llama_cpp as L
import numpy as np
import pytest

from shared import dry, samplers
from shared.penalties import adjust
from shared.sampling import distribution, mirostat_mu
from shared.wire.protocol import DRY_BREAKERS, SamplingParams

N_VOCAB = 200


def random_logits(seed: int, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0.0, scale, N_VOCAB)).astype(np.float32)


@contextmanager
def llama(sampler: object) -> Iterator[object]:
    try:
        yield sampler
    finally:
        L.llama_sampler_free(sampler)


def apply(sampler: object, logits: np.ndarray, history: Sequence[int] = (),
          ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """llama.cpp's sampler (fed `history` first) over `logits` (of `ids`; by default
    0, 1, ...): the ids it leaves, their logits and probabilities, the id it picked (-1:
    none)."""
    for token in history:
        L.llama_sampler_accept(sampler, int(token))
    ids = np.arange(logits.size) if ids is None else ids
    data = (L.llama_token_data * logits.size)()
    for i, logit in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = int(ids[i]), float(logit), 0.0
    cur = L.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
    L.llama_sampler_apply(sampler, ctypes.byref(cur))
    start = (ctypes.addressof(cur.data.contents) - ctypes.addressof(data)) // \
        ctypes.sizeof(L.llama_token_data)  # (XTC moves the start)
    kept = [data[start + i] for i in range(cur.size)]
    ids = np.array([d.id for d in kept])
    picked = int(ids[cur.selected]) if cur.selected >= 0 else -1
    return ids, np.array([d.logit for d in kept]), np.array([d.p for d in kept]), picked


def ordered(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-logits, kind="stable")
    return ids, logits[ids].astype(np.float64)


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("p", "min_keep"), [(0.2, 0), (0.5, 0), (0.9, 0), (0.5, 9), (0.95, 3)])
def test_typical_keeps_what_llama_cpp_keeps(seed: int, p: float, min_keep: int) -> None:
    logits = random_logits(seed)
    with llama(L.llama_sampler_init_typical(p, min_keep)) as s:
        theirs = apply(s, logits)[0]
    ids, x = ordered(logits)
    kept = samplers.typical(x, p, min_keep)
    assert set(ids[kept]) == set(theirs.tolist())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("p", "min_keep"), [(0.3, 0), (0.8, 0), (0.3, 12), (0.99, 1)])
def test_top_p_keeps_what_llama_cpp_keeps(seed: int, p: float, min_keep: int) -> None:
    logits = random_logits(seed)
    with llama(L.llama_sampler_init_top_p(p, min_keep)) as s:
        theirs = apply(s, logits)[0]
    ids, x = ordered(logits)
    assert set(ids[:samplers.top_p(x, samplers.logsumexp(x), p, min_keep)]) == set(theirs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("p", "min_keep"), [(0.05, 0), (0.3, 0), (0.3, 15), (0.9, 2)])
def test_min_p_keeps_what_llama_cpp_keeps(seed: int, p: float, min_keep: int) -> None:
    logits = random_logits(seed)
    with llama(L.llama_sampler_init_min_p(p, min_keep)) as s:
        theirs = apply(s, logits)[0]
    ids, x = ordered(logits)
    assert set(ids[:samplers.min_p(x, p, min_keep)]) == set(theirs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("threshold", "min_keep"), [(0.02, 0), (0.1, 0), (0.3, 0), (0.02, 190),
                                                     (0.6, 0)])
def test_xtc_keeps_what_llama_cpp_keeps(seed: int, threshold: float, min_keep: int) -> None:
    logits = random_logits(seed, scale=2.5)
    with llama(L.llama_sampler_init_xtc(1.0, threshold, min_keep, 7)) as s:  # always on
        theirs = apply(s, logits)[0]
    ids, x = ordered(logits)
    start = samplers.xtc(x, 0.5, 1.0, threshold, min_keep)
    assert set(ids[start:]) == set(theirs)
    assert samplers.xtc(x, 0.7, 0.6, threshold, min_keep) == 0  # the chance not drawn


CHAINS = [
    SamplingParams(temperature=0.7, top_k=60, typical_p=0.8, top_p=0.9, min_p=0.01,
                   xtc_probability=1.0, xtc_threshold=0.05),
    SamplingParams(temperature=1.3, typical_p=0.95, top_p=0.7, min_p=0.05, min_keep=5),
    SamplingParams(temperature=0.5, top_k=20, top_p=0.5, xtc_probability=1.0,
                   xtc_threshold=0.02, min_keep=3),
    SamplingParams(temperature=1.0, min_p=0.1, typical_p=0.5),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params", CHAINS, ids=range(len(CHAINS)))
def test_the_chain_in_llama_server_s_order_gives_llama_cpp_s_distribution(
        seed: int, params: SamplingParams) -> None:
    """common/sampling.cpp's default chain, temperature last; XTC always on (coin 0)."""
    logits = random_logits(seed)
    chain = [L.llama_sampler_init_top_k(params.top_k),
             L.llama_sampler_init_typical(params.typical_p, params.min_keep),
             L.llama_sampler_init_top_p(params.top_p, params.min_keep),
             L.llama_sampler_init_min_p(params.min_p, params.min_keep),
             L.llama_sampler_init_xtc(params.xtc_probability, params.xtc_threshold,
                                      params.min_keep, 1),
             L.llama_sampler_init_temp(params.temperature)]
    ids, x = np.arange(N_VOCAB), logits
    for sampler in chain:
        with llama(sampler) as s:
            ids, x = apply(s, x, ids=ids)[:2]
    ours = distribution(logits, params, coin=0.0)
    assert set(ours.token_ids.tolist()) == set(ids.tolist())
    theirs = dict(zip(ids.tolist(), samplers.softmax(x.astype(np.float64)), strict=True))
    assert np.allclose(ours.probs, [theirs[t] for t in ours.token_ids.tolist()], atol=1e-6)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("tau", "eta", "temperature"), [(5.0, 0.1, 1.0), (3.0, 0.5, 0.8),
                                                         (1.5, 1.0, 1.2)])
def test_mirostat_truncates_as_llama_cpp_does_step_after_step(
        version: int, tau: float, eta: float, temperature: float) -> None:
    """Each step, lead's mu updated with the token llama.cpp picked: the same top-k (1.0)
    or surprise cut (2.0), the same probabilities, step after step."""
    params = SamplingParams(temperature=temperature, mirostat=version, mirostat_tau=tau,
                            mirostat_eta=eta)
    init = L.llama_sampler_init_mirostat(N_VOCAB, 3, tau, eta, samplers.MIROSTAT_M) \
        if version == 1 else L.llama_sampler_init_mirostat_v2(3, tau, eta)
    mu = None
    with llama(init) as s:
        for step in range(16):
            logits = random_logits(100 + step, scale=1.0 + step % 4)
            ids, _, probs, picked = apply(s, logits / np.float32(temperature))
            ours = distribution(logits, params, mu=mu)
            assert set(ours.token_ids.tolist()) == set(ids.tolist()), step
            assert np.allclose(ours.probs, probs[np.argsort(-probs, kind="stable")], atol=1e-5)
            mu = mirostat_mu(mu, params, ours.prob_of(picked))


DRY_CASES = [(0.8, 1.75, 2, 64), (2.0, 1.1, 3, 16), (1.0, 3.0, 1, 30), (0.5, 1.75, 0, 64)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("mult", "base", "allowed", "last_n"), DRY_CASES)
def test_dry_penalises_as_llama_cpp_does(seed: int, mult: float, base: float, allowed: int,
                                         last_n: int) -> None:
    """Histories from a few tokens (repeats abound), no sequence breakers."""
    gen = np.random.default_rng(seed)
    history = gen.integers(0, 4, 48).tolist()
    history[-6:] = history[-14:-8]  # a long repeat at the end, inside every window
    logits = random_logits(seed)
    with llama(L.llama_sampler_init_dry(None, mult, base, allowed, last_n, None, 0)) as s:
        _, theirs, _, _ = apply(s, logits, history)
    params = SamplingParams(dry_multiplier=mult, dry_base=base, dry_allowed_length=allowed,
                            dry_penalty_last_n=last_n)
    ours = logits.copy()
    dry.penalize(ours, params, np.array(history))
    assert np.array_equal(ours, theirs.astype(np.float32))
    assert not np.array_equal(ours, logits)  # (it penalises here)


def test_mirostat_keeps_the_bias_and_leaves_the_penalties_off_as_llama_server_does() -> None:
    """common/sampling.cpp: with mirostat the chain is the bias, temperature, mirostat."""
    params = SamplingParams(temperature=1.0, mirostat=2, logit_bias={1: 5.0}, repeat_penalty=2.0,
                            frequency_penalty=1.0, dry_multiplier=1.0, dry_allowed_length=0)
    out = adjust(np.ones(4, dtype=np.float32), params, [2, 3, 2, 3, 2], 2)
    assert out.tolist() == [1.0, 6.0, 1.0, 1.0]


# llama.cpp's own cases (tests/test-sampling.cpp), breakers as tokens
LLAMA_DRY = [
    ([0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, {}, [0.25] * 4),
    ([0, 1, 2, 0, 1], [0.25] * 4, 1.0, 1.1, 2, 5, {},
     [0.296923, 0.296923, 0.109232, 0.296923]),
    ([0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, {3: ((),)}, [0.2] * 5),
    ([0, 1, 2, 0, 1], [0.2] * 5, 2.0, 1.1, 2, 5, {},
     [0.241818, 0.241818, 0.032727, 0.241818, 0.241818]),
    ([0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, {}, [0.2] * 5),
]


@pytest.mark.parametrize("case", LLAMA_DRY, ids=range(len(LLAMA_DRY)))
def test_dry_passes_llama_cpp_s_own_cases(case: tuple) -> None:
    history, probs, mult, base, allowed, last_n, restarts, expected = case
    params = SamplingParams(dry_multiplier=mult, dry_base=base, dry_allowed_length=allowed,
                            dry_penalty_last_n=last_n, dry_restarts=restarts)
    row = np.log(np.array(probs, dtype=np.float32))
    dry.penalize(row, params, np.array(history))
    assert np.allclose(samplers.softmax(row.astype(np.float64)), expected, atol=1e-5)


def test_a_breaker_of_several_tokens_stops_a_repeat_only_whole() -> None:
    """Head 5 then 6 restarts the count; 5 then 7 does not."""
    params = SamplingParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1,
                            dry_restarts={5: ((6,),)})
    rows = {}
    for name, history in (("cut", [1, 5, 6, 2, 9, 1, 5, 6, 2]),
                          ("whole", [1, 5, 7, 2, 9, 1, 5, 7, 2])):
        rows[name] = np.zeros(10, dtype=np.float32)
        dry.penalize(rows[name], params, np.array(history))
    assert rows["cut"][9] == -1.0  # the repeat counts from the breaker on: "2", 2 ^ 0
    assert rows["whole"][9] == -8.0  # "1 5 7 2" again: 9 would extend it, 2 ^ (4 - 1)


def test_restart_sequences_are_llama_cpp_s_overlapping_token_sequences() -> None:
    pieces = [b"a", b"\n", b"x\ny", b"ab:", b"q:", b"</", b"<", b"s>", b"/", b"zz"]
    vocab = {p: i for i, p in enumerate(pieces)}

    def tokenize(text: bytes) -> list[int]:  # greedy, longest piece first
        out, at = [], 0
        while at < len(text):
            piece = max((p for p in pieces if text.startswith(p, at)), key=len)
            out, at = [*out, vocab[piece]], at + len(piece)
        return out

    got = dry.restart_sequences(pieces, tokenize, ["\n", ":", "</s>"])
    assert got == {1: ((),), 2: ((),), 3: ((),), 4: ((),), 5: ((7,),), 6: ((8, 7),)}


@pytest.mark.real
@pytest.mark.parametrize("allowed", [1, 2])
def test_dry_s_breakers_over_a_real_vocabulary_are_llama_cpp_s(allowed: int) -> None:
    """llama-server's default breakers, as SmolLM2's tokens: lead's (shared/dry.py, from the
    tokens' text) and llama.cpp's (llama_sampler_init_dry with the vocabulary) agree."""
    from shared.llama.model import load_model

    model = load_model("smollm2-135m", threads=1, n_ctx=512)
    history = model.tokenize("Name: Ann \"x\" *a*\nAge: 3\nName: Ann \"x\" *a*\nAge: 3\n"
                             "Name: Ann \"x\" *a", add_bos=False)
    params = dry.with_restarts(SamplingParams(dry_multiplier=0.8, dry_allowed_length=allowed,
                                              dry_penalty_last_n=64), model)
    breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*[b.encode() for b in DRY_BREAKERS])
    logits = np.random.default_rng(1).normal(0.0, 2.0, model.n_vocab).astype(np.float32)
    init = L.llama_sampler_init_dry(model._vocab, 0.8, 1.75, allowed, 64, breakers,
                                    len(DRY_BREAKERS))
    with llama(init) as s:
        _, theirs, _, _ = apply(s, logits, history)
    ours = logits.copy()
    dry.penalize(ours, params, np.array(history))
    assert np.array_equal(ours, theirs.astype(np.float32))
    blind = logits.copy()  # breakers unknown: the penalties reach further back
    dry.penalize(blind, params.model_copy(update={"dry_restarts": None}), np.array(history))
    assert not np.array_equal(blind, ours)
