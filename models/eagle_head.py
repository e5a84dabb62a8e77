"""An EAGLE-style draft head: one decoder layer that extrapolates the target's last-layer feature.

EAGLE (Li et al. 2024, arXiv:2401.15077) drafts at the feature level: entry i is
fc([embed(x_{i+1}); f_i]), the target's feature at i beside the token chosen there, and one
decoder layer over the entries before it predicts f_{i+1}, which the target's frozen final norm
and tied LM head decode into a draft. A chain feeds its predicted features back, so k drafts
cost k passes of one layer. The LM head reads only a draft vocabulary of frequent tokens (FR-Spec,
arXiv:2502.14856), as the full head is most of what a pass reads; `layers` stacks layers and
`fuse_layers` fuses lower layers' features (EAGLE-3, arXiv:2503.01840). Shapes, the draft
vocabulary's figures and fusion: docs/eagle-head.md; how the shipped head was trained:
eagle/data/README.md.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.cuda_graphs import GraphRunner
from models.int8_weight import Int8Weight
from models.kv_cache import KVCache, RowLayout
from models.llama import (
    DecoderLayer,
    LlamaModel,
    batch_attention,
    decoder_layer,
    exact_pool,
    graph_runner,
    make_pool,
    rms_norm,
)
from models.paged_kv import KVPool, PagedSeq
from traces import atomic_write

#: The shipped head for SmolLM2-135M-Instruct (how it was trained: eagle/data/README.md).
SHIPPED_HEAD = Path(__file__).resolve().parents[1] / "eagle" / "data" / "smollm2-135m-eagle.npz"
_LAYER_PARAMS = ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")


def unit_rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Rows scaled to root-mean-square 1. SmolLM2's features have RMS ~33 with single dimensions
    in the hundreds, its embeddings ~0.1: the head works on their directions (the final RMSNorm
    the drafts pass through ignores a feature's scale anyway), and predicts unit-RMS features."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class EagleHead(nn.Module):
    """The head's own weights (fc, one layer) plus read-only views of the target's embedding,
    final norm and the draft vocabulary's rows of its LM head (shared, not part of state)."""

    def __init__(self, target: LlamaModel, vocab_ids: torch.Tensor,
                 fuse_layers: Sequence[int] = (), layers: int = 1) -> None:
        super().__init__()
        shape = target.config.shape
        if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= 8:
            raise ValueError(f"an EAGLE head has 1 to 8 decoder layers, got {layers!r}")
        if shape.qkv_bias:
            raise ValueError("the EAGLE head is built for Llama shapes without q/k/v biases")
        ids = torch.as_tensor(vocab_ids, dtype=torch.int64).flatten()
        if ids.numel() == 0 or ids.min() < 0 or ids.max() >= shape.vocab:
            raise ValueError(f"draft vocabulary ids must lie in 0..{shape.vocab - 1}")
        if ids.unique().numel() != ids.numel():
            raise ValueError("draft vocabulary ids repeat")
        self.config = replace(target.config, shape=replace(
            shape, name=f"{shape.name}-EAGLE", layers=layers,
            source=f"EAGLE head of {shape.name}"))
        dtype, device = target.config.dtype, target.config.device
        self.fc = nn.Parameter(torch.zeros(2 * shape.hidden, shape.hidden, dtype=dtype,
                                           device=device), requires_grad=False)
        self.fc_bias = nn.Parameter(torch.zeros(shape.hidden, dtype=dtype, device=device),
                                    requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(self.config) for _ in range(layers))
        self.kv_pool: KVPool | None = None  # the head's own paged pool (config.paged)
        self.fuse_layers = tuple(int(i) for i in fuse_layers)
        self.fuse: nn.Parameter | None = None
        if self.fuse_layers:
            if target.feature_layers not in ((), self.fuse_layers):
                raise ValueError(f"the target already hands out layers "
                                 f"{list(target.feature_layers)}, this head fuses "
                                 f"{list(self.fuse_layers)}")
            target.set_feature_layers(self.fuse_layers)
            self.fuse = nn.Parameter(torch.zeros(self.feature_width, shape.hidden, dtype=dtype,
                                                 device=device), requires_grad=False)
        self._target = (target,)  # a tuple: the target is not a submodule of the head
        self.register_buffer("vocab_ids", ids.to(device), persistent=False)
        head = target.embed if target.lm_head is None else target.lm_head
        self.head_rows = head.index_select(1, self.vocab_ids)  # [hidden, draft vocab], a copy

    @property
    def target(self) -> LlamaModel:
        return self._target[0]

    @property
    def layer(self) -> DecoderLayer:
        """The first (for a one-layer head, the only) decoder layer."""
        return self.layers[0]

    @property
    def draft_vocab(self) -> int:
        return int(self.vocab_ids.numel())

    def reserve_pool(self, sequences: int, tokens_each: int) -> None:
        """As LlamaModel.reserve_pool, for the head's own pool."""
        if self.config.paged:
            self.kv_pool = None
            self.kv_pool = exact_pool(self.config, sequences, tokens_each)

    def new_cache(self, capacity: int = 256) -> KVCache | PagedSeq:
        if self.config.paged:
            if self.kv_pool is None:
                self.kv_pool = make_pool(self.config)
            return self.kv_pool.sequence(capacity)
        s = self.config.shape
        return KVCache(s.layers, s.kv_heads, s.head_dim, capacity, self.config.dtype,
                       self.config.device)

    @property
    def feature_width(self) -> int:
        """Columns of a true feature row: `hidden` per fused layer, then the last layer's."""
        return (len(self.fuse_layers) + 1) * self.config.shape.hidden

    def slot(self, features: torch.Tensor) -> torch.Tensor:
        """The feature half of an entry at unit RMS [n, hidden]: a predicted feature [n, hidden]
        as it is, a true fused one [n, feature_width] through `fuse`."""
        hidden = self.config.shape.hidden
        width = features.shape[-1]
        if width == hidden:
            return unit_rms(features)
        if self.fuse is None or width != self.feature_width:
            raise ValueError(f"features of width {width}: this head reads {hidden} (predicted)"
                             + (f" or {self.feature_width} (true, fused)" if self.fuse is not None
                                else ""))
        features = features.to(self.config.device, self.config.dtype)
        return unit_rms(unit_rms_blocks(features, hidden) @ self.fuse)

    def entries(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([embed(x_{i+1}); f_i]) for tokens [n] (the x_{i+1}) and features [n, hidden] (or
        true fused ones, `slot`), each half scaled to unit RMS per row (`unit_rms`)."""
        embedded = unit_rms(self.target.embed.index_select(1, tokens).t())
        x = torch.cat((embedded, self.slot(features.to(embedded))), dim=-1)
        if isinstance(self.fc, Int8Weight):
            return x @ self.fc + self.fc_bias
        return torch.addmm(self.fc_bias, x, self.fc)

    def layer_forward(self, x: torch.Tensor, positions: torch.Tensor, end: int,
                      attention) -> torch.Tensor:
        """The decoder layers over entries x at absolute `positions` (< end): predicted
        features."""
        cos, sin = self.target.rotary.gather(positions, end)
        if torch.is_grad_enabled() and cos.is_inference():  # the table grew in inference mode
            cos, sin = cos.clone(), sin.clone()
        for index, layer in enumerate(self.layers):
            x = decoder_layer(self.config, index, layer, x, cos, sin, attention)
        return x

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [rows, draft vocab] of (predicted) features; of a
        true fused feature row, its last layer's block."""
        features = features[..., -self.config.shape.hidden :]
        return rms_norm(features, self.target.norm, self.config.rms_eps) @ self.head_rows

    @property
    def weights(self) -> str:
        """"int8" once `quantize` ran, else the target's dtype name."""
        return "int8" if isinstance(self.fc, Int8Weight) else str(self.config.dtype).split(".")[-1]

    def quantize(self) -> EagleHead:
        """Weight-only int8 for drafting (models/int8_weight.py): the layer's four matrices,
        fc, fuse and the draft vocabulary's LM-head rows; norms, biases and the embedding stay.
        For inference only: a quantised head can be neither trained nor saved."""
        if self.weights == "int8":
            return self
        with torch.no_grad():
            matrices = [(layer, n) for layer in self.layers
                        for n in ("qkv", "o", "gate_up", "down")]
            for module, name in matrices + [(self, "fc")] + (
                    [(self, "fuse")] if self.fuse is not None else []):
                weight = module._parameters.pop(name)
                object.__setattr__(module, name, Int8Weight(weight))
            self.head_rows = Int8Weight(self.head_rows)
        return self

    @torch.inference_mode()
    def forward(self, tokens: list[torch.Tensor], features: list[torch.Tensor],
                caches: list[KVCache], layouts: list[RowLayout | None] | None = None,
                every_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed per request the entries (tokens[r], features[r]) after its cache; return the
        last new entry's predicted feature [requests, hidden] and draft logits [requests, V_d]
        (with `every_row`, those of every new entry, packed request after request). `layouts`:
        a draft tree's nodes (kv_cache.RowLayout), as in the target's forward. Chains' passes
        on CUDA replay CUDA graphs, as the target's decode does (models/cuda_graphs.py)."""
        q, widths = [t.shape[0] for t in tokens], {f.shape[-1] for f in features}
        if (self.config.cuda_graphs and layouts is None and not every_row and len(widths) == 1
                and self.weights != "int8" and isinstance(caches[0], PagedSeq)):
            runner = self._graph_runner(caches[0].pool, widths.pop())
            if runner.accepts(q, caches):
                hidden, logits = runner.run(tokens, caches, last=True, features=features)
                return torch.cat(hidden), torch.cat(logits)
        batch = batch_attention(q, caches, self.config, layouts)
        if len({f.shape[-1] for f in features}) == 1:
            x = self.entries(torch.cat(tokens), torch.cat(features))
        else:  # true (fused) features for some requests, predicted ones for others
            x = torch.cat([self.entries(t, f) for t, f in zip(tokens, features)])
        out = self.layer_forward(x, batch.positions(), batch.max_length, batch)
        batch.commit()
        last = out if every_row else out[batch.last_rows()]
        return last, self.draft_logits(last)


    def _graph_runner(self, pool: KVPool, feature_width: int) -> GraphRunner:
        """The head's graphs over `pool` for features of this width (predicted ones, or the
        target's true fused ones)."""
        return graph_runner(self, pool, self.target.rotary, feature_width)

    def _graph_body(self, tokens: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass a graph captures: every row's predicted feature and draft logits."""
        out = self.layer_forward(self.entries(tokens, batch.features), batch.positions(),
                                 batch.max_length, batch)
        return out, self.draft_logits(out)


class HeadTiming:
    """The head as the profiler times a draft model (`model(tokens, caches, logits=...)`): each
    token enters with a feature of the shape the drafter feeds there (values do not change a
    pass's time) and the draft logits come out for each request's last entry, as the drafter
    asks for them.

    Which shape: a pass that feeds several tokens of a request (a prompt, or a chain's first
    pass catching up on what the target committed) feeds the target's true features, which a
    fused head first maps through `fuse` ([(layers + 1) * hidden, hidden]: ~10% of a head pass
    on the 2-core CPU, 1.10-1.13x at batch 1, 5 and 16 in fp32); the chain's later passes feed
    one predicted feature each. A first pass in which every request feeds a single token also
    reads true features, but is timed as a later pass would be: the latency model tells passes
    apart by their query only (simulator/profiled.py), so those passes are ~10% under-priced."""

    #: the drafter re-feeds every token committed since its last chain (simulator/draft_feed.py)
    catch_up = "committed"

    def __init__(self, head: EagleHead) -> None:
        self.head, self.config = head, head.config

    def new_cache(self, capacity: int = 256) -> KVCache | PagedSeq:
        return self.head.new_cache(capacity)

    def reserve_pool(self, sequences: int, tokens_each: int) -> None:
        self.head.reserve_pool(sequences, tokens_each)

    def fed_width(self, tokens: list[torch.Tensor]) -> int:
        """The width of the features the drafter feeds in a pass of these tokens per request."""
        several = any(t.shape[0] > 1 for t in tokens)
        return self.head.feature_width if several else self.config.shape.hidden

    def __call__(self, tokens: list[torch.Tensor], caches: list[KVCache], logits: str = "last"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.fed_width(tokens)
        features = [torch.ones(t.shape[0], width, dtype=self.config.dtype,
                               device=self.config.device) for t in tokens]
        return self.head(tokens, features, caches)


def unit_rms_blocks(x: torch.Tensor, width: int) -> torch.Tensor:
    """`unit_rms` of each `width`-column block of every row (fused features: one per layer)."""
    return unit_rms(x.reshape(*x.shape[:-1], -1, width)).reshape(x.shape)


def head_state(head: EagleHead) -> dict[str, torch.Tensor]:
    """The head's own weights by name (fc, fc_bias, layer.* for a one-layer head or layers.I.*,
    and fuse if it fuses layers)."""
    if head.weights == "int8":
        raise ValueError("an int8-quantised head is for drafting only: train and save the "
                         "head it was quantised from")
    state = {"fc": head.fc, "fc_bias": head.fc_bias}
    for index, layer in enumerate(head.layers):
        prefix = "layer" if len(head.layers) == 1 else f"layers.{index}"
        state.update({f"{prefix}.{n}": getattr(layer, n) for n in _LAYER_PARAMS})
    if head.fuse is not None:
        state["fuse"] = head.fuse
    return state


def save_head(head: EagleHead, path: Path, meta: dict) -> None:
    """fp16 weights, the draft vocabulary and `meta` (what it was trained on) in one .npz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {n: t.detach().to(torch.float16).cpu().numpy() for n, t in head_state(head).items()}
    arrays["vocab_ids"] = head.vocab_ids.cpu().numpy().astype(np.int32)
    meta = {**meta, "target": head.target.config.shape.name,
            "fuse_layers": list(head.fuse_layers), "layers": len(head.layers)}
    with atomic_write(path) as handle:
        np.savez_compressed(handle, meta=np.asarray(json.dumps(meta)), **arrays)


def read_meta(path: Path) -> dict:
    with np.load(path) as data:
        return json.loads(str(data["meta"]))


def load_head(target: LlamaModel, path: Path | None = None) -> EagleHead:
    """A saved head on the target's dtype and device, checked against the target's shape."""
    path = Path(path) if path is not None else SHIPPED_HEAD
    if not path.is_file():
        raise ValueError(f"no EAGLE head at {path}: train one with scripts/train_eagle.py")
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {name: data[name] for name in data.files if name != "meta"}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: not an EAGLE head file ({type(error).__name__}: {error}); "
                         f"give a scripts/train_eagle.py output") from None
    name = target.config.shape.name
    if meta.get("target") != name:
        raise ValueError(f"{path}: a head for {meta.get('target')}, not for {name}")
    try:
        head = EagleHead(target, torch.as_tensor(arrays.pop("vocab_ids").astype(np.int64)),
                         meta.get("fuse_layers", ()), meta.get("layers", 1))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
    state = head_state(head)
    if set(arrays) != set(state):
        raise ValueError(f"{path}: weights {sorted(arrays)} != expected {sorted(state)}")
    with torch.no_grad():
        for n, tensor in state.items():
            if tuple(arrays[n].shape) != tuple(tensor.shape):
                raise ValueError(f"{path}: {n} has shape {arrays[n].shape}, need "
                                 f"{tuple(tensor.shape)}")
            tensor.copy_(torch.as_tensor(arrays[n]))
    head.meta = meta
    return head
