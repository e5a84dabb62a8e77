"""Weight-only int8 weights (models/int8_weight.py) and the `eagle@int8` drafter name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.tiny_models import TINY  # noqa: E402

from drafters import make_drafter  # noqa: E402
from models.eagle_head import EagleHead, save_head  # noqa: E402
from models.int8_weight import Int8Weight  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_products_are_the_dequantised_weights_products(dtype):
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 40, generator=gen) * torch.linspace(0.01, 3.0, 40)).to(dtype)
    q = Int8Weight(w)
    # each column's rounding is at most half its step (max|column| / 127, as stored)
    step = q.scale.float()
    assert (step >= w.float().abs().amax(dim=0) / 127).all()
    assert ((q.q.t().float() * step - w.float()).abs() <= step / 2 * (1 + 1e-6)).all()
    x = torch.randn(2, 3, 96, generator=gen).to(dtype)  # batch dims pass through
    out = x @ q
    assert out.shape == (2, 3, 40) and out.dtype == dtype
    exact = x.float() @ q.dequantized().float()  # the int8 weights' product, in fp32
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # of the largest output: bf16 keeps 8 bits
    assert (out.float() - exact).abs().max() <= tol * exact.abs().max()
    with pytest.raises(ValueError, match="2-D weight"):
        Int8Weight(torch.ones(4))


def test_eagle_at_int8_names_the_quantised_head(tmp_path):
    target = LlamaModel.random(config_for(TINY), seed=0)
    path = tmp_path / "head.npz"
    save_head(EagleHead(target, torch.arange(TINY.vocab)), path, {"trained_on": "test"})
    assert make_drafter(f"eagle:{path}", target).head.weights == "float32"
    for name in ("eagle@int8", "eagle+ngram@int8", "eagle-tree@int8"):
        drafter = make_drafter(f"{name}:{path}", target)
        assert drafter.head.weights == "int8" and drafter.name == f"{name}:{path}"
        assert (drafter.lookup is not None) == name.startswith("eagle+ngram")
        assert (drafter.tree is not None) == name.startswith("eagle-tree")
    with pytest.raises(ValueError, match=r"eagle@int8, not @int4"):
        make_drafter(f"eagle@int4:{path}", target)
