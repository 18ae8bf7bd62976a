"""The GPU check, prepared here and run in one call on a lent device (docs/gpu.md).

pack (python -m device.pack): what the device lacks, in .device/; gguf_gen: random-weight
GGUFs of real shapes; measure: verify and draft prices; serve: lead on the device, a back on
the CPU, killed and restarted mid-reply; predict: the placements priced; report: JSON and
Markdown. scripts/device-check.sh runs them in order, each under a time limit.
"""
