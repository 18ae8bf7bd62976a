"""Will duo be faster here? Expected speed of each placement from measured prices.

Pure arithmetic over what `bench.advise` measures: the target's verify seconds per batch
size on every core and on lead's share of the cores, the draft's seconds per token, and
how often the draft's greedy token is the target's. Each placement is priced as the
benchmark prices it (bench/ideal.py: the async ideal, or free drafts for a draft on
another device), against lead alone on every core.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.ideal import async_ideal, free_draft_bound, padded

PAYS = 1.05  # below this a second process is not worth running (the benchmark's spread)


@dataclass(frozen=True)
class Split:
    """This CPU shared: lead on `lead_cpus`, the back drafting on `back_cpus`."""

    lead_cpus: str
    back_cpus: str
    quiet_s: float  # the target's one-token step on lead's cores, nothing beside it
    busy: dict[int, float]  # verify seconds per batch size there, while the draft drafts
    draft_s: float  # the draft's seconds per token on the back's cores, beside the target


@dataclass(frozen=True)
class Measured:
    every_core: dict[int, float]  # the target's verify seconds per batch size, every core
    n_cpus: int
    alpha: float  # share of the target's tokens that the draft's greedy token matched
    draft_every_core_s: float  # the draft's seconds per token on every core
    max_draft: int  # what lead verifies at most per step
    split: Split | None  # None: one CPU, nothing to split


@dataclass(frozen=True)
class Outlook:
    placement: str
    speed: float  # expected decode speed over lead alone on every core
    why: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def cpus(text: str) -> str:
    """'0' -> 'CPU 0', '0-3' -> 'CPUs 0-3'."""
    return f"CPUs {text}" if "-" in text or "," in text else f"CPU {text}"


def outlooks(m: Measured) -> list[Outlook]:
    """Lead alone on every core (1.00x), lead alone on lead's share, duo split on this CPU,
    and duo with the draft elsewhere: as fast as this CPU, and free (the upper bound)."""
    base = m.every_core[1]
    rows = [Outlook(f"lead alone, every core ({m.n_cpus} CPUs)", 1.0,
                    f"target {_ms(base)}/token: the reference")]
    if m.split is not None:
        rows += _split_outlooks(m, m.split)
    ideal, k = async_ideal(padded(m.every_core), m.alpha, m.draft_every_core_s, m.max_draft)
    rows.append(Outlook("duo, back on a second machine like this one", ideal, (
        f"target on every core, draft {_ms(m.draft_every_core_s)}/token on cores of its own, "
        f"network ignored: {_gain(ideal, k)}")))
    free, k = free_draft_bound(padded(m.every_core), m.alpha, m.max_draft)
    rows.append(Outlook("duo, draft on another device, free (upper bound)", free, (
        f"target on every core, drafts free and always ready (a GPU back comes closest): "
        f"{_gain(free, k)}")))
    return rows


def _gain(speedup: float, k: int) -> str:
    if k == 0 or speedup < 1.0:
        return "no draft length pays: 1.00x"
    return f"best k={k} gives {speedup:.2f}x"


def _split_outlooks(m: Measured, s: Split) -> list[Outlook]:
    base = m.every_core[1]
    alone = base / s.quiet_s
    rows = [Outlook(f"lead alone on {cpus(s.lead_cpus)}", alone, (
        f"target {_ms(s.quiet_s)}/token there, {_ms(base)} on every core: {alone:.2f}x"))]
    ideal, k = async_ideal(padded(s.busy), m.alpha, s.draft_s, m.max_draft)
    share = base / s.busy[1]
    drafting = share * ideal
    where = f"duo split: lead on {cpus(s.lead_cpus)}, back on {cpus(s.back_cpus)}"
    beside = (f"target there is {share:.2f}x of every core while the draft drafts beside it "
              f"({_ms(s.draft_s)}/token)")
    if k and drafting > alone:
        why = f"{beside}; best k={k} gives {ideal:.2f}x of that: {drafting:.2f}x"
        return [*rows, Outlook(where, drafting, why)]
    gain = f"best k={k} gives {ideal:.2f}x of that, {drafting:.2f}x" if k else \
        "no draft length pays"
    why = (f"{beside}; {gain}; so lead verifies nothing and decodes alone there: "
           f"{alone:.2f}x")
    return [*rows, Outlook(where, alone, why)]


def recommend(m: Measured, rows: list[Outlook]) -> str:
    """One line: split this CPU, or give lead every core (and what a draft elsewhere gives)."""
    by_name = {r.placement: r for r in rows}
    split = next((r for r in rows if r.placement.startswith("duo split")), None)
    free = next(r for r in rows if r.placement.startswith("duo, draft on another device"))
    second = by_name["duo, back on a second machine like this one"]
    if split is not None and m.split is not None and split.speed >= PAYS:
        return (f"split this CPU: lead with --cpus {m.split.lead_cpus}, a back beside it "
                f"(it takes {cpus(m.split.back_cpus)}): expected {split.speed:.2f}x lead "
                "alone on every core")
    here = "a back on this CPU does not pay" + (
        f" (split: {split.speed:.2f}x)" if split is not None else " (one CPU: nothing to split)")
    if free.speed < PAYS:
        return (f"give lead every core (the default); {here}; even free drafts would give "
                f"{free.speed:.2f}x: speculation with this pair does not pay on this target")
    elsewhere = f"a draft on another device could give up to ~{free.speed:.2f}x"
    if second.speed >= PAYS:
        elsewhere += f" (~{second.speed:.2f}x from a second machine like this one)"
    return f"give lead every core (the default); {here}; {elsewhere}"


def cost_line(costs: dict[int, float]) -> str:
    """'b=2 1.57x, b=3 2.07x, ...': verify cost over one token's."""
    return ", ".join(f"b={b} {c / costs[1]:.2f}x" for b, c in sorted(costs.items()) if b > 1)


def report(m: Measured, prompts: int, tokens: int) -> str:
    rows = outlooks(m)
    lines = [f"target verify cost / one token, every core: {cost_line(m.every_core)}"]
    if m.split is not None:
        lines.append(f"  on {cpus(m.split.lead_cpus)} with the draft drafting on "
                     f"{cpus(m.split.back_cpus)}: {cost_line(m.split.busy)}; slowdown of a "
                     f"one-token step from the draft beside it: "
                     f"{m.split.busy[1] / m.split.quiet_s:.2f}x")
        lines.append(f"draft {_ms(m.split.draft_s)}/token on {cpus(m.split.back_cpus)} beside "
                     f"the target, {_ms(m.draft_every_core_s)}/token on every core")
    else:
        lines.append(f"draft {_ms(m.draft_every_core_s)}/token on every core")
    lines += [f"draft agreement with the target's greedy replies ({prompts} prompts, {tokens} "
              f"tokens): {m.alpha:.2f} per token", "",
              "| placement | expected speed | why |", "|---|---|---|"]
    lines += [f"| {r.placement} | {r.speed:.2f}x | {r.why} |" for r in rows]
    lines += ["", f"recommendation: {recommend(m, rows)}"]
    return "\n".join(lines)
