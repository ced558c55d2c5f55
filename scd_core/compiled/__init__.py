"""Compiled calls: how a run makes its window calls, eagerly or at static shapes (run_calls), what compile=True
makes of a model (compilable), compiled regions with their eager fallback, per-width CUDA graphs kept for the
next image, what a kept graph needs of the next image, and calls at fixed shapes whose bits do not depend on the
window (invariant: bfloat16 / float16).

Imports the adapter protocol (scd_core.model) only."""
