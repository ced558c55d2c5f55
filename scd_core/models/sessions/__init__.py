"""Sessions: the row cache (rows at their own pace, candidate trees, dropping finished rows), row attention over
it, the one row session every family shares and its network for transformers backbones (cfg_session), the
transformers cache view (hf_cache), rows closed by row-end tokens (code_rows) and cache rows kept across the
segments of one long sequence (kept_rows).

Imports the adapter protocol (scd_core.model) and compiled/ (calls at fixed shapes, compiled/invariant.py)."""
