"""python -m bench.coverage: the rank of the target's token among the draft's choices, and
the counting of acceptance and coverage over those ranks (pure, with fake rows)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from bench.coverage import parse, rank_of, ranks, table, tally
from bench.procs import ROOT


def test_rank_counts_the_draft_choices_above_the_target_token() -> None:
    row = np.array([0.1, 3.0, 2.0, -1.0, 2.5])
    assert [rank_of(row, t) for t in (1, 4, 2, 0, 3)] == [0, 1, 2, 3, 4]


def test_ties_rank_as_argmax_breaks_them() -> None:
    row = np.array([1.0, 5.0, 5.0, 5.0])
    assert int(np.argmax(row)) == 1
    assert [rank_of(row, t) for t in (1, 2, 3, 0)] == [0, 1, 2, 3]


def test_ranks_pair_each_row_with_its_position_token() -> None:
    rows = [np.array([0.0, 1.0, 2.0]), np.array([2.0, 1.0, 0.0])]
    assert ranks(rows, [2, 2]) == [0, 2]
    with pytest.raises(ValueError):
        ranks(rows, [2])


def test_coverage_counts_only_rejections_and_is_cumulative() -> None:
    # 10 positions: 6 accepted (rank 0); the 4 rejections' corrections at ranks 1, 1, 3, 7
    c = tally([0, 1, 0, 0, 1, 3, 0, 7, 0, 0])
    assert (c.positions, c.accepted, c.rejections) == (10, 6, 4)
    assert c.acceptance == pytest.approx(0.6)
    assert [c.cover(m) for m in (1, 2, 3)] == [0.5, 0.5, 0.75]


def test_no_rejection_leaves_coverage_undefined() -> None:
    assert tally([0, 0]).cover(1) is None and tally([]).acceptance is None


def test_the_table_has_a_row_per_kind_and_one_for_all() -> None:
    text = table({"code": [0, 0, 0, 1], "explain": [0, 2, 5, 0]})
    lines = text.splitlines()
    assert lines[0] == ("| prompts | positions | acceptance | rejections | m=1 (2nd choice) | "
                        "m=2 (2nd-3rd) | m=3 (2nd-4th) |")
    assert "| code | 4 | 0.75 | 1 | 1.00 | 1.00 | 1.00 |" in lines
    assert "| explain | 4 | 0.50 | 2 | 0.00 | 0.50 | 0.50 |" in lines
    assert "| all | 8 | 0.62 | 3 | 0.33 | 0.67 | 0.67 |" in lines


def test_quick_is_smollm2_for_both_and_bad_counts_are_errors(
        capsys: pytest.CaptureFixture[str]) -> None:
    quick = parse(["--quick"])
    assert (quick.target, quick.draft, quick.prompts, quick.tokens) == \
        ("smollm2-135m", "smollm2-135m", 2, 24)
    with pytest.raises(SystemExit):
        parse(["--tokens", "0"])
    assert "--tokens must be at least 1" in capsys.readouterr().err


@pytest.mark.real
def test_smollm2_drafting_for_itself_ranks_the_target_token_first() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.coverage", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| all |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[1]) > 0 and float(cells[2]) >= 0.9  # the same model: (nearly) all rank 0
    assert "commit " in done.stdout and "prompt 2/2" in done.stderr
