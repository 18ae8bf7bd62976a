"""PostBook: what the back posts, given its draft, and what it already posted."""

from __future__ import annotations

from back.posts import PostBook
from shared.wire.protocol import DraftDist


def dist(token: int) -> DraftDist:
    return DraftDist(token_ids=[token], probs=[1.0])


def test_a_draft_already_posted_is_not_posted_again() -> None:
    book = PostBook()
    first = book.next_post("s", 3, [4, 5, 6], "b")
    assert first is not None and first[0].start == 3 and first[0].token_ids == [4, 5, 6]
    assert book.next_post("s", 3, [4, 5, 6], "b") is None
    assert book.next_post("s", 4, [5, 6], "b") is None  # lead took 4: the rest was posted
    assert book.next_post("s", 4, [], "b") is None


def test_only_tokens_no_post_carried_count_as_drafted() -> None:
    book = PostBook()
    assert book.next_post("s", 3, [4, 5], "b")[1] == 2  # type: ignore[index]
    made = book.next_post("s", 3, [4, 5, 6, 7], "b")  # the same draft, grown by two
    assert made is not None and made[0].token_ids == [4, 5, 6, 7] and made[1] == 2
    made = book.next_post("s", 5, [6, 7, 8], "b")  # lead took two; one more drafted
    assert made is not None and made[1] == 1
    made = book.next_post("s", 6, [9], "b")  # redrafted after a rejection at 6
    assert made is not None and made[1] == 0  # a position some post carried already


def test_distributions_go_with_a_post_only_when_every_token_has_one() -> None:
    book = PostBook()
    book.drafted(n_lead=3, kept=3, dists={3: dist(4), 4: dist(5)})
    made = book.next_post("s", 3, [4, 5], "b")
    assert made is not None and made[0].dists == [dist(4), dist(5)]
    made = book.next_post("s", 3, [4, 5, 6], "b")  # 6 has none (a greedy guess)
    assert made is not None and made[0].dists is None
    book = PostBook()
    book.drafted(n_lead=3, kept=3, dists={3: dist(4), 4: dist(5)})
    made = book.next_post("s", 3, [4, 5], "b", with_dists=False)
    assert made is not None and made[0].dists is None


def test_redrafted_positions_drop_their_old_distributions() -> None:
    book = PostBook()
    book.drafted(n_lead=3, kept=3, dists={3: dist(4), 4: dist(5), 5: dist(6)})
    book.drafted(n_lead=3, kept=4, dists={})  # catching up cut the drafter back to 4 tokens
    made = book.next_post("s", 3, [4, 5], "b")  # 5 at position 4 is another guess now
    assert made is not None and made[0].dists is None
    book.drafted(n_lead=3, kept=4, dists={4: dist(7)})
    made = book.next_post("s", 3, [4, 7], "b")
    assert made is not None and made[0].dists == [dist(4), dist(7)]


def test_a_guess_lead_replaced_keeps_no_distribution() -> None:
    book = PostBook()
    book.drafted(n_lead=3, kept=3, dists={3: dist(4)})
    # lead rejected 4 at position 3 and took 9 there; the drafter caught up to 4 tokens
    book.drafted(n_lead=4, kept=4, dists={4: dist(5)})
    made = book.next_post("s", 3, [9, 5], "b")  # (a post from lead's old length)
    assert made is not None and made[0].dists is None


def test_the_draft_models_probabilities_go_with_a_post_and_follow_redrafts() -> None:
    book = PostBook()
    book.drafted(n_lead=3, kept=3, dists={}, probs={3: 0.9, 4: 0.51234567})
    made = book.next_post("s", 3, [4, 5], "b")
    assert made is not None and made[0].probs == [0.9, 0.5123]
    book.drafted(n_lead=3, kept=4, dists={}, probs={})  # position 4 redrafted, no q yet
    made = book.next_post("s", 3, [4, 6], "b")
    assert made is not None and made[0].probs is None
    book.drafted(n_lead=4, kept=4, dists={}, probs={4: 0.3, 5: 0.8})
    made = book.next_post("s", 4, [6, 7], "b")
    assert made is not None and made[0].probs == [0.3, 0.8]
