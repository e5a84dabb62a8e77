"""The models spectune runs: a Llama decoder (random weights of a catalog shape, or real SmolLM2
from GGUF), its KV cache, the tokenizer, int8 weights, the EAGLE head module, and the target's
own continuations. torch-only; the base of the profiler, the drafters and the live engine."""
