"""Code shared by lead and back: wire protocol, sampling, model presets, CLI helpers."""
