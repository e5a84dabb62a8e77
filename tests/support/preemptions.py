"""Counting vLLM's preemptions in a test's runs (simulator/scheduler_vllm.py)."""

from __future__ import annotations


def counted_preemptions(monkeypatch) -> list:
    """A list that gains an entry at each call of `VllmV1Scheduler._make_room` (each call
    preempts at least one request), over the rest of the test."""
    from simulator.scheduler_vllm import VllmV1Scheduler

    preempting = []
    make_room = VllmV1Scheduler._make_room

    def counted_room(self, *args):
        preempting.append(1)
        return make_room(self, *args)
    monkeypatch.setattr(VllmV1Scheduler, "_make_room", counted_room)
    return preempting
