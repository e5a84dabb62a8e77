"""The target cut after its first L layers: the model an early-exit drafter and a tuned lens run."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from models.llama import LlamaModel


def early_exit_model(target: LlamaModel, layers: int) -> LlamaModel:
    """The target's first `layers` layers + its final norm and LM head, sharing its parameters.

    Own KV caches (the target's first layers compute the same K/V, but sharing them would couple
    the two caches' rollbacks); no weight is copied.
    """
    total = target.config.shape.layers
    if not 1 <= layers <= total:
        raise ValueError(f"early exit needs 1..{total} layers of the target, got {layers}")
    shape = replace(
        target.config.shape,
        name=f"{target.config.shape.name}-EE{layers}",
        layers=layers,
        source=f"first {layers} layers of {target.config.shape.name}",
    )
    model = LlamaModel(replace(target.config, shape=shape))
    model.layers = nn.ModuleList(target.layers[:layers])
    model.embed, model.norm, model.lm_head = target.embed, target.norm, target.lm_head
    return model
