"""A copy under way followed past each change, for lead's own drafts (pure over ids).

A file echoed back with changes copies its source but where it changes it; a reply asked
for again copies the last one but where a near-tie went the other way. Once the sequence's
end matches ANCHOR tokens of a source (earlier in the sequence, or a remembered session),
that copy is followed: it drafts the source from where the reply has got to, with each
change seen so far made again where its old tokens come again (a rename, learned at its
first use, is drafted at every later one), and past a change it finds where the copy
resumes from the first tokens that agree with the source near where the reply left it,
without waiting for a KEY-token match (shared/ngram.py). A change that turns out not to be
made again is forgotten.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.ngram import Match

ANCHOR = 12  # a match this long is a copy under way: it is followed from there
NEAR = 64  # source tokens a change may skip: the copy resumes at most this far on
CHANGE = 16  # the longest change (old or new tokens) made again where its old tokens recur
CHANGES = 32  # changes kept per copy, the oldest dropped first
CONFIRM = 4  # tokens a resumed copy agrees for before its change is learned (else: where
# the reply left the copy still holds: a short anchor may have been a common token)
# Odds by tokens agreed since the copy (re)started: a copy resumed past a change by one
# token is often wrong (a common token), one agreeing for a line seldom.
FOLLOWING = {0: 0.3, 1: 0.45, 3: 0.6, 6: 0.7, 12: 0.8, 24: 0.9, 48: 0.95}

Change = tuple[tuple[int, ...], tuple[int, ...]]  # old tokens, new
Changes = dict[tuple[int, ...], tuple[int, ...]]  # old tokens -> new


@dataclass
class Follow:
    """A copy followed: the reply's tokens up to `seq` copy the source up to `src` (with
    `changes` made), agreeing for `agreed` tokens; `left`: where the reply left the copy
    (its position and the source's), until it resumes; `trial`: where it left the copy
    last and the change made there, until the copy resumed there is confirmed; `source`:
    the tokens copied where they are not the sequence's own (None: they are)."""

    seq: int
    src: int
    agreed: int = 0
    changes: Changes = field(default_factory=dict)
    left: tuple[int, int] | None = None
    trial: tuple[tuple[int, int], Change | None] | None = None
    source: Sequence[int] | None = None


def drafted(tokens: Sequence[int], src: int, changes: Changes, most: int,
            source: Sequence[int] | None = None
            ) -> list[tuple[int, int | None, tuple[int, ...] | None]]:
    """Up to `most` tokens copied from `source[src:]` (`tokens`' own where None) with
    `changes` made, running on into its own tokens past the sequence's end (a repeating
    pattern): per token, the source position the copy is at after it (None inside a
    change's new tokens) and the change (its old tokens) it came from, if any."""
    out: list[tuple[int, int | None, tuple[int, ...] | None]] = []
    text = tokens if source is None else source
    n, i = len(text), src
    while len(out) < most:
        if i >= n and (source is not None or i - n >= len(out)):
            break
        old = None if i >= n or not changes else next(
            (o for o in changes if tuple(text[i:i + len(o)]) == o), None)
        if old is None:  # past the sequence's end the copy reads itself
            out.append((text[i] if i < n else out[i - n][0], i + 1, None))
            i += 1
        else:
            new, i = changes[old], i + len(old)
            out.extend((t, i if j == len(new) - 1 else None, old) for j, t in enumerate(new))
    return out[:most]


def advance(f: Follow, tokens: Sequence[int]) -> None:
    """Check the reply's tokens since `f.seq` against the copy: move along as far as they
    agree (to the last whole token of the source), and where they part, note where the reply
    left the copy and forget a change that was not made again there."""
    emitted, parted = tokens[f.seq:], False
    seq, src = f.seq, f.src
    for j, ((t, after, change), token) in enumerate(
            zip(drafted(tokens, f.src, f.changes, len(emitted), f.source), emitted,
                strict=False)):
        if t != token:
            if change is not None:
                del f.changes[change]
            parted = True
            break
        if after is not None:
            seq, src = f.seq + j + 1, after
    f.agreed += seq - f.seq
    f.seq, f.src = seq, src
    if parted:
        f.left, f.trial = f.trial[0] if f.trial else (seq, src), None
    else:
        _confirm(f)


def _confirm(f: Follow) -> None:
    """Once the copy resumed has agreed CONFIRM tokens, learn the change made there."""
    if f.trial is None or f.agreed < CONFIRM:
        return
    if f.trial[1] is not None:
        f.changes.update([f.trial[1]])
        for old in list(f.changes)[:-CHANGES]:
            del f.changes[old]
    f.trial = None


def resync(f: Follow, tokens: Sequence[int]) -> None:
    """Where the reply's tokens since it left the copy end in a run found in the source
    soon after where it left (the longest run; of its places, the nearest), the copy
    resumes past that run; what the reply wrote there in place of the source's tokens is a
    change, made again where they recur once the copy is confirmed."""
    assert f.left is not None
    (p, q), n = f.left, len(tokens)
    text, bound = (tokens, p) if f.source is None else (f.source, len(f.source))
    places: dict[int, list[int]] = {}
    for t in range(q, min(q + NEAR, bound)):
        places.setdefault(text[t], []).append(t)
    for r in range(max(p, n - NEAR), n):  # the longest run first
        run = list(tokens[r:n])
        t = next((t for t in places.get(tokens[r], ()) if t + len(run) <= bound
                  and list(text[t:t + len(run)]) == run), None)
        if t is not None:
            old, new = tuple(text[q:t]), tuple(tokens[p:r])
            change = (old, new) if old and old != new and max(len(old), len(new)) <= CHANGE \
                else None
            f.seq, f.src, f.agreed, f.left = n, t + len(run), len(run), None
            f.trial = ((p, q), change)
            _confirm(f)
            return


def moved(f: Follow, tokens: Sequence[int]) -> None:
    """`f` after the reply's tokens since the last call: along the copy, or left it, or
    resumed it."""
    if f.left is None:
        advance(f, tokens)
    if f.left is not None:
        resync(f, tokens)


def followed(tokens: Sequence[int], f: Follow, most: int) -> Match | None:
    """The copy past `tokens`, its length the tokens agreed since it (re)started; where
    the reply has left it and not resumed, a guess: that the change kept the length."""
    # past the tokens since `f.seq`: the part of a change's new tokens the sequence ends with
    src, agreed, emitted = f.src, f.agreed, len(tokens) - f.seq
    if f.left is not None:
        src, agreed, emitted = f.left[1] + len(tokens) - f.left[0], 0, 0
    copy = tuple(t for t, _, _ in drafted(tokens, src, f.changes, most + emitted,
                                          f.source))[emitted:]
    return Match(copy, agreed + emitted, src if f.source is None else None) if copy else None
