"""What pays: verify prices, acceptance, probes and draft lengths (pure)."""
