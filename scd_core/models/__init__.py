"""Model families: one module per family (adapter plus its image tokenizer).

Each family module offers `detect(folder) -> bool` and `load(folder, device, dtype)`;
`scd_core.models.loading` asks them in order.
"""
