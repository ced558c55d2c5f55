"""Model families: one module per family (adapter plus its image tokenizer).

Each family module declares itself (`FAMILY`, a `family.Family`) and offers `detect(folder) -> bool` and
`load(folder, device, dtype, quantize)`; `family.MODULES` lists them in the order `loading` asks them.
"""
