"""The price table: seconds per evaluation of b tokens, from repeated timings (pure).

A row is one model in one placement (a target on the GPU, partly offloaded, a draft on the
GPU or on CPU cores). `python -m device.measure` takes the timings; this module makes them
the figures the predictions use: the median per batch size, each size over one token, the
linear fit `python -m bench --sim` takes (seconds per call, per token), and Markdown.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

SIM_SIZES = range(1, 18)  # the batches lead verifies: up to 8 draft tokens and 8 branches
SHOWN = (1, 2, 4, 8, 16, 32, 64)


def medians(samples: Mapping[int | str, Iterable[float]]) -> dict[int, float]:
    """The median seconds per batch size (JSON keys come back as strings)."""
    return {int(b): statistics.median(list(s)) for b, s in samples.items() if list(s)}


def ratios(table: Mapping[int, float]) -> dict[int, float]:
    """Each batch's price over one token's."""
    one = table[1]
    return {b: c / one for b, c in sorted(table.items())}


def verify_cost_flag(table: Mapping[int, float], top: int = 17) -> str:
    """lead's --verify-cost: b=2, 3, ... over b=1, as far as measured without a gap."""
    r = ratios(table)
    out = []
    for b in range(2, top + 1):
        if b not in r:
            break
        out.append(f"{max(r[b], 1.0):.3f}")
    return ",".join(out)


def linear_fit(table: Mapping[int, float], sizes: Iterable[int] = SIM_SIZES
               ) -> tuple[float, float]:
    """(seconds per call, seconds per token) by least squares over the sizes measured, both
    at least 0: what bench.sim's simulated target costs (`--sim-target CALL,TOKEN`)."""
    points = [(b, table[b]) for b in sizes if b in table]
    if not points:
        raise ValueError("no batch size to fit")
    if len(points) == 1:
        return points[0][1], 0.0
    xs, ys = [float(b) for b, _ in points], [c for _, c in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, 0.0)
    call = my - slope * mx
    if call < 0:  # through the origin instead
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return call, slope


def fit_error(table: Mapping[int, float], fit: tuple[float, float],
              sizes: Iterable[int] = SIM_SIZES) -> float:
    """The largest relative error of the fit over the sizes measured."""
    call, per = fit
    return max((abs(call + per * b - table[b]) / table[b] for b in sizes if b in table),
               default=0.0)


def markdown(rows: Mapping[str, Mapping[int, float]], shown: Iterable[int] = SHOWN) -> str:
    """One row per placement: one token's milliseconds, then each shown batch over it."""
    cols = [b for b in shown if b != 1]
    lines = ["| placement | b=1 ms | " + " | ".join(f"b={b}" for b in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, table in rows.items():
        r = ratios(table)
        cells = [f"{r[b]:.2f}x" if b in r else "-" for b in cols]
        lines.append(f"| {name} | {table[1] * 1e3:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
