"""torch-only: models of catalog shapes, real SmolLM2 weights, timing and profile sweeps,
drafters, and the live speculative-decoding engine. The only package that imports torch."""
