"""Measuring tools: benchmarks (`python -m scd_core.bench`), the GPU device check, the demo's training and
quality check, and the synthetic models they run on.  The library never imports this package."""
