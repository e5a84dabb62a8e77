"""Tiny torch models: one thread (support/torch_threads.py)."""

from support.torch_threads import one_thread  # noqa: F401  (an autouse fixture)
