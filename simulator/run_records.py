"""The rows of a run of steps' records (`stepped.StepsRun.records`), which the compiled loops
(simulator/compiled_steps.py) write into the runners' buffer (`stepped._buffers`): the clock
before each step (and after the last), each step's time, drafts, most drafts, accepted and
emitted tokens, and KV tokens in allocated blocks (vLLM's scheduler). A module of its own so
that the loops and the runners read one layout without importing each other."""

CLOCK, DURATION, DRAFTED, MAX_K, ACCEPTED, EMITTED, KV = range(7)
RECORDS = 7
