"""GET /metrics: what lead counts and what it holds now, in Prometheus's text format,
written by prometheus_client at the moment of each scrape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lead.decode.metrics import Metrics

PREFIX = "duo_"
COUNTERS = (  # (Metrics field, exported name: duo_<name>_total, HELP)
    ("requests", "requests", "replies finished"),
    ("rejected", "requests_rejected", "requests turned away with a full queue"),
    ("prompt_tokens", "prompt_tokens", "prompt tokens of finished replies"),
    ("prompt_evaluated", "prompt_tokens_evaluated", "prompt tokens evaluated (not cached)"),
    ("generated_tokens", "generated_tokens", "tokens generated"),
    ("drafted", "drafted_tokens", "draft tokens verified"),
    ("accepted", "accepted_tokens", "draft tokens accepted"),
    ("steps", "verify_steps", "target steps"),
    ("rejections", "rejecting_steps", "steps that rejected a draft token"),
    ("drafts_posted", "draft_posts", "draft posts taken from backs"),
    ("drafts_stale", "draft_posts_stale", "draft posts for a position already passed"),
    ("drafts_invalid", "draft_posts_invalid", "draft posts refused as malformed"),
    ("drafts_untrusted", "draft_posts_untrusted",
     "draft posts without the back key: their distributions dropped"),
    ("link_updates", "link_updates", "updates pushed to backs on /duo/link"),
    ("steps_after_rejection", "steps_after_rejection",
     "steps whose previous step in the reply rejected a draft token"),
    ("ready_after_rejection", "ready_after_rejection",
     "of those, the steps that found a draft ready"),
    ("branch_drafts", "branch_drafts", "steps whose draft came from a branch"),
    ("clients_cut", "clients_cut_off",
     "connections cut off: their client read nothing for --write-timeout"),
)
GAUGES = {
    "acceptance_rate": "accepted over drafted tokens, over every reply",
    "decode_tokens_per_second": "generated tokens over decoding seconds, over every reply",
    "draft_len": "draft tokens lead asks backs for now",
    "verify_len": "draft tokens lead would verify now",
    "backs_active": "backs heard from lately",
    "queue_waiting": "requests waiting for a slot",
    "slots": "generations lead runs at once (--parallel)",
    "slots_busy": "slots holding a generation",
    "prompt_cache_bytes": "host memory held by prompts' cells saved from their slots "
                          "(--cache-ram)",
    "prompt_cache_entries": "prompts whose cells host memory holds",
    "slowdown": "lead's step time while backs work, over its quiet time",
    "hush": "1 while backs are told not to draft (they slow lead more than drafts repay)",
    "alpha": "estimated chance a draft token is accepted, mid-reply",
    "alpha_first": "estimated chance the first draft token of a reply is accepted",
}
SLOT_GAUGES = {
    "busy": "whether the slot holds a generation (1) or is idle (0)",
    "prompt_left": "prompt tokens still to evaluate",
    "tokens": "tokens generated in its reply so far",
    "drafted": "draft tokens verified in its reply so far",
    "accepted": "draft tokens accepted in its reply so far",
}


def exposition(metrics: Metrics, gauges: Mapping[str, float],
               verify_cost: Mapping[int, float] | None = None,
               slots: Sequence[Mapping[str, object]] = ()) -> str:
    """`gauges`: names of GAUGES with their values now (Engine.gauges()); `verify_cost`:
    seconds per target step by batch size; `slots`: Engine.slot_views()."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape([*_counters(metrics), *_gauges(metrics, gauges),
                               *_costs(verify_cost or {}), *_slots(slots)]))
    return generate_latest(registry).decode()


class _Scrape:
    """A collector of families built for one scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _counters(metrics: Metrics) -> Iterator[Metric]:
    for field, name, text in COUNTERS:
        yield CounterMetricFamily(PREFIX + name, text, value=getattr(metrics, field))


def _gauges(metrics: Metrics, gauges: Mapping[str, float]) -> Iterator[Metric]:
    rate = metrics.accepted / metrics.drafted if metrics.drafted else 0.0
    tps = metrics.generated_tokens / metrics.decode_seconds if metrics.decode_seconds else 0.0
    now = {"acceptance_rate": rate, "decode_tokens_per_second": tps, **gauges}
    for name, value in now.items():
        yield GaugeMetricFamily(PREFIX + name, GAUGES[name], value=float(value))


def _costs(verify_cost: Mapping[int, float]) -> Iterator[Metric]:
    if verify_cost:
        family = GaugeMetricFamily(PREFIX + "verify_cost_seconds",
                                   "seconds one target step takes, by tokens in its batch",
                                   labels=["batch"])
        for batch, seconds in sorted(verify_cost.items()):
            family.add_metric([str(batch)], seconds)
        yield family


def _slots(slots: Sequence[Mapping[str, object]]) -> Iterator[Metric]:
    for name, text in SLOT_GAUGES.items() if slots else ():
        family = GaugeMetricFamily(f"{PREFIX}slot_{name}", text, labels=["slot"])
        for view in slots:
            value = float(view["state"] != "idle") if name == "busy" else view.get(name, 0)
            family.add_metric([str(view["slot"])], float(value))  # type: ignore[arg-type]
        yield family
