"""The live engine: serves a workload with real forward passes by executing the simulator's
scheduler (engine, loop, chunked loop, verification, replay, requests, pass timer), and the
recorder of speculation traces. torch-only."""
