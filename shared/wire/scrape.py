"""Reading lead's /metrics: every sample by name, a labelled one as name{label="value"}."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def read_samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
