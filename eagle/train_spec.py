"""The settings of one EAGLE head training (saved with the weights, part of a checkpoint's name)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainSpec:
    """How the head is trained (saved with the weights)."""

    epochs: int = 4
    lr: float = 2e-3
    warmup_steps: int = 20
    sequences_per_step: int = 4
    depths: int = 3  # chain depths trained on (1: plain EAGLE teacher forcing)
    depth_decay: float = 0.8
    cls_weight: float = 1.0
    window: int = 512  # the last `window` positions of a sequence (attention span in training)
    grad_clip: float = 1.0
    seed: int = 0
    feature_noise: float = 0.0  # half-width of U(-a, a) added to the unit-RMS input features
    layer_init: str = "random"  # or "last": the layer starts as the target's last layer

    def __post_init__(self) -> None:
        if not 0.0 <= self.feature_noise < 10.0:
            raise ValueError(f"feature_noise is the half-width of the uniform noise on unit-RMS "
                             f"features, in [0, 10); got {self.feature_noise}")
        if self.layer_init not in LAYER_INITS:
            raise ValueError(f"layer_init must be one of {', '.join(LAYER_INITS)}; "
                             f"got {self.layer_init!r}")


#: How the head's decoder layer starts: "random" (near identity, `init_head`) or "last" (the
#: target's last layer, its output projections rescaled to the unit-RMS stream, `init_head`).
LAYER_INITS = ("random", "last")
