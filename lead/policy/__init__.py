"""What pays: verify prices, acceptance, probes, draft lengths and trees (pure)."""
