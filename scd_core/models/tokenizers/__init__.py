"""Image tokenizers: VQ-16 (LlamaGen, Janus), taming's VQGAN and its encoder (Chameleon's VQGAN, MoVQGAN),
IBQ (Emu3.5), and image encoders read on first use.

Imports weights/ and images/ (an IMAGE to pixels)."""
