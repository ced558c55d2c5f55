"""Models: what a family is (family: each family's declaration and the registry MODULES), which family a folder
is (loading), decoded pixels that depend on the tokens alone (pixels), what transformers' `generate` samples with
for a folder (generate_defaults) and fetching a published model folder from the hub (fetch), over families/ (one
module per family), tokenizers/ (image tokenizers and encoders), text/ (text encoders and tokenizers), sessions/
(the KV cache and the one row session every family shares) and weights/ (safe weights, folder checks, streaming,
quantisation, memory estimates).

Imports decoding/, images/, compiled/ and the adapter protocol; nothing in it imports jobs/ or the front ends."""
