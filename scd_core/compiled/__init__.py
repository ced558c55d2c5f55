"""Compiled calls: how a run makes its window calls, eagerly or at static shapes (run_calls), what compile=True
makes of a model (compilable), compiled regions with their eager fallback, per-width CUDA graphs kept for the
next image, and what a kept graph needs of the next image.

Imports the adapter protocol (scd_core.model) only."""
