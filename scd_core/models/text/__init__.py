"""Text encoders and tokenizers the families share: T5 encoders and their captions (LlamaGen, Cosmos) and the
tiktoken BPE (Emu3.5).

Imports weights/."""
