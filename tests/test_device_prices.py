"""The price table and the predictions made from it (pure arithmetic), and the Markdown the
device check writes."""

from __future__ import annotations

import pytest

from device import prices, report
from device.check import overheads
from device.plan import CPU, CUDA
from device.predict import (
    duo_ideal_rate,
    plain_rate,
    predict,
    read_sim,
    sim_args,
    sim_size,
    sync_rate,
)

GPU_LIKE = {b: 0.010 + 0.0002 * b for b in range(1, 65)}  # flat: a token more is 2 %
CPU_LIKE = {b: 0.010 * b for b in range(1, 65)}  # a token more costs a token


def test_medians_take_json_keys_and_skip_empty_sizes() -> None:
    assert prices.medians({"1": [3.0, 1.0, 2.0], "2": [4.0], "3": []}) == {1: 2.0, 2: 4.0}


def test_ratios_and_the_flag_lead_takes() -> None:
    table = {1: 0.010, 2: 0.011, 3: 0.009, 5: 0.02}
    assert prices.ratios(table)[2] == pytest.approx(1.1)
    # b=3 cheaper than b=1 is kept at 1.0 (lead refuses prices under one token's); stops at
    # the first size not measured
    assert prices.verify_cost_flag(table) == "1.100,1.000"


def test_the_linear_fit_recovers_a_linear_price_and_is_never_negative() -> None:
    call, per = prices.linear_fit(GPU_LIKE)
    assert (call, per) == (pytest.approx(0.010), pytest.approx(0.0002))
    assert prices.fit_error(GPU_LIKE, (call, per)) < 1e-9
    # falling prices: no negative slope; a line through the origin rather than a negative call
    assert prices.linear_fit({1: 0.02, 2: 0.01})[1] == 0.0
    assert prices.linear_fit({1: 0.001, 2: 0.004, 3: 0.007}) == (0.0, pytest.approx(
        (0.001 + 2 * 0.004 + 3 * 0.007) / 14))
    with pytest.raises(ValueError):
        prices.linear_fit({32: 1.0})


def test_the_markdown_table_has_a_row_per_placement() -> None:
    text = prices.markdown({"gpu": GPU_LIKE, "partial": {1: 0.1, 2: 0.15}})
    lines = text.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| gpu | 10.20 | 1.02x |")
    assert lines[3].endswith("| - | - | - | - |")


def test_plain_and_synchronous_rates() -> None:
    assert plain_rate(GPU_LIKE, 0.0) == pytest.approx(1 / 0.0102)
    assert plain_rate(GPU_LIKE, 0.0048) == pytest.approx(1 / 0.015)
    # free perfect drafts on a flat target: the longest draft that was priced
    rate, k = sync_rate(GPU_LIKE, 1.0, 0.0, 0.0)
    assert k == 16 and rate > 10 * plain_rate(GPU_LIKE, 0.0)
    # on a CPU-like target no draft pays: plain decoding
    rate, k = sync_rate(CPU_LIKE, 0.8, 0.001, 0.0)
    assert k == 0 and rate == pytest.approx(plain_rate(CPU_LIKE, 0.0))


def test_the_async_ideal_beats_plain_where_verifying_is_cheap_and_not_where_it_is_not() -> None:
    rate, k = duo_ideal_rate(GPU_LIKE, 0.85, 0.65, 0.003, 0.0)
    assert k > 0 and rate > 2 * plain_rate(GPU_LIKE, 0.0)
    rate, _ = duo_ideal_rate(CPU_LIKE, 0.85, 0.65, 0.003, 0.0)
    assert rate == pytest.approx(plain_rate(CPU_LIKE, 0.0), rel=0.05)


def test_predictions_per_placement_and_a_placement_not_priced() -> None:
    tables = {"t": GPU_LIKE, "d": {1: 0.003}}
    rows = predict(tables, [{"name": "ok", "target": "t", "draft": "d"},
                            {"name": "lost", "target": "t", "draft": "gone"}],
                   {"agreement": 0.86, "cover": 0.65}, {"lead": 0.001, "llama_server": 0.0005})
    assert rows[0]["llama_server"] == pytest.approx(1 / 0.0107)
    assert rows[0]["lead_alone"] == pytest.approx(1 / 0.0112)
    assert rows[0]["duo_ideal"] > rows[0]["llama_server_draft"] > rows[0]["llama_server"]
    assert "not priced" in rows[1]["error"]


def test_the_simulations_arguments_and_size() -> None:
    args = sim_args(GPU_LIKE, 0.003, 0.86, 0.65, 4, 64, __import__("pathlib").Path("/x"))
    assert args[args.index("--sim-target") + 1] == "0.010000,0.000200"
    assert args[args.index("--prompts") + 1] == "4" and args[-1] == "/x"
    assert sim_size(GPU_LIKE, 60) == 6  # ~5.9 s a prompt, after 20 s of starting
    assert sim_size(GPU_LIKE, 200) == 8
    assert sim_size({1: 0.05, 2: 0.06}, 60) == 1  # 21 s a prompt
    assert sim_size({1: 1.0}, 60) == 1


def test_a_failed_simulation_reads_as_its_error(tmp_path) -> None:
    assert read_sim(tmp_path / "sim.json", 1, "boom")["error"] == "exit 1"
    (tmp_path / "sim.json").write_text('{"summaries": [{"config": "SIM lead alone", "tok_s": 9},'
                                       ' {"config": "SIM duo: lead + back", "tok_s": 27}]}')
    got = read_sim(tmp_path / "sim.json", 0, "")
    assert (got["lead_alone_tok_s"], got["duo_tok_s"]) == (9, 27)


def test_overheads_are_what_a_server_adds_to_the_evaluation() -> None:
    tables = {CUDA.prices[0].label: {1: 0.004}}
    got = overheads({"lead_alone_tok_s": 200.0, "llama_server": {"tok_s": 240.0}}, tables, CUDA)
    assert got["lead"] == pytest.approx(0.001) and got["llama_server"] == pytest.approx(
        1 / 240 - 0.004)
    assert overheads({}, tables, CUDA) == {"lead": 0.0, "llama_server": 0.0, "measured": []}
    # a C++ step cheaper than the priced evaluation: negative, so its plain speed is its own
    got = overheads({"llama_server": {"tok_s": 500.0}}, tables, CUDA)
    assert got["llama_server"] == pytest.approx(-0.002)


def test_every_placement_names_price_runs_of_its_plan() -> None:
    for plan in (CUDA, CPU):
        labels = {r.label for r in plan.prices}
        assert all({p.target, p.draft} <= labels for p in plan.placements)
        assert plan.serve_shape in plan.shapes
        assert {r.shape for r in plan.prices} <= set(plan.shapes)


def test_the_summary_says_what_failed() -> None:
    data = {"device_kind": "cuda", "device": {"gpu": "H100", "cpus": 16},
            "steps": [{"step": "build", "status": "timeout", "seconds": 330, "line": "x|y"}],
            "serve": {"checks": {"lead alive": True, "second back alive": False}},
            "prices": {"t": {"rounds": 2, "samples": {"1": [0.01], "2": [0.011]}},
                       "u": {"error": "exit 1"}},
            "predict": {"rows": [{"name": "p", "error": "not priced"}]}}
    text = report.markdown(data)
    assert "| build | timeout | 330 | x/y |" in text
    assert "- FAILED: second back alive" in text and "- ok: lead alive" in text
    assert "| t | 10.00 | 1.10x |" in text and "- u: exit 1" in text
    assert "| p | not priced |" in text
    assert report.markdown({}).startswith("# duo device check (?)")
