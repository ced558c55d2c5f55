"""Jobs: a stream of (conditioning, seed) jobs decoded with continuous batching (batching.generate_many), over
the engine's public Run.

Imports decoding/, windows/ and the adapter protocol."""
