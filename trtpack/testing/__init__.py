"""Models and helpers for tests and benchmarks (no weights to download)."""
