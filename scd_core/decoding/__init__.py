"""Decoding: the exact algorithm.  The Jacobi loop (engine), one window's verification (verify), the couplers,
the sampling law and its options, the cells no row samples (forced and given), guidance, candidates, keyed
randomness, the config and the run's statistics.

Imports the adapter protocol (scd_core.model), windows/ and compiled/; nothing above it."""
