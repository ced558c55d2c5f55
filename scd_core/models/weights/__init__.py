"""Weights and folders: safe weight reading (checkpoints), folder checks (hf_folders), text tokenizer and
settings files, streaming a network in one tensor at a time, what generation never runs, int8 / nf4 layers
(quantize) and what a folder needs at each precision (memory).

Imports compiled/ only (the window-invariant calls' row tiles, for 4-bit layers)."""
