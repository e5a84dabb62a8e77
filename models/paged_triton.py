"""Paged attention for passes of a few tokens per request, reading K/V in place (Triton).

The torch backend (paged_kv.attend_gathered) copies every request's blocks into a padded
tensor before SDPA: that reads the cache twice and writes it once, so a decode pass at a large
batch moves ~3x the KV bytes it must. This kernel walks each request's block table instead.

One program per (request, KV head, split of the context): its rows are the G query heads of
that KV head times the q new tokens (row = g * q + i), so grouped-query attention reads each
K/V row once for all G heads. Each split keeps a running max and sum (online softmax, Milakov &
Gimelshein 2018); a second kernel merges the splits, as flash-decoding does (Dao et al. 2023),
and writes the output in the queries' layout; with one split (large batches) the first kernel
writes it. Two launches per layer at most, where a merge in torch took about ten. Key j
is visible to new token i of request r iff j <= c_r + i (causal over cache and new tokens).
"""

from __future__ import annotations

import math

import torch

from models.padded_layout import pad_queries, unpad_output

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU install has no triton; the torch backend runs
    triton = None

#: programs to aim for: two waves over a 132-SM H100/H200 keep every SM busy
TARGET_PROGRAMS = 264
#: keys per loop iteration (4 blocks of 16)
KEYS_PER_STEP = 64


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _split_kernel(Q, K, V, TABLE, CACHED, ACC, M_OUT, L_OUT, OUT,
                      stride_qb, stride_qi, stride_qh,
                      stride_ks, stride_kh,
                      stride_tb,
                      stride_ab, stride_ah, stride_as, stride_am,
                      stride_mb, stride_mh, stride_ms,
                      stride_ob, stride_oi, stride_oh,
                      scale, splits, width,
                      QMAX: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                      D: tl.constexpr, BS: tl.constexpr, KB: tl.constexpr,
                      DIRECT: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        rows = tl.arange(0, ROWS)
        g = rows // QMAX
        i = rows % QMAX
        real = rows < GROUP * QMAX
        d = tl.arange(0, D)
        q = tl.load(Q + b * stride_qb + i[:, None] * stride_qi + (h * GROUP + g)[:, None]
                    * stride_qh + d[None, :], mask=real[:, None], other=0.0)
        c = tl.load(CACHED + b)
        limit = c + i  # the last key each row sees
        keys_here = c + QMAX  # split this request's keys evenly, in whole loop steps
        per_split = tl.cdiv(tl.cdiv(keys_here, splits), KB) * KB
        start = s * per_split
        end = tl.minimum(tl.minimum(start + per_split, keys_here), width)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        for k0 in range(start, end, KB):
            keys = k0 + tl.arange(0, KB)
            inside = keys < end
            block = tl.load(TABLE + b * stride_tb + keys // BS, mask=inside, other=0)
            slot = block * BS + keys % BS
            offsets = slot[:, None] * stride_ks + h * stride_kh + d[None, :]
            k = tl.load(K + offsets, mask=inside[:, None], other=0.0)
            v = tl.load(V + offsets, mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale  # [ROWS, KB] in fp32
            seen = (keys[None, :] <= limit[:, None]) & inside[None, :]
            scores = tl.where(seen, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: no NaN
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if DIRECT:  # one split: the output itself, in the queries' layout and dtype
            tl.store(OUT + b * stride_ob + i[:, None] * stride_oi + (h * GROUP + g)[:, None]
                     * stride_oh + d[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
                     mask=real[:, None])
        else:
            out = b * stride_ab + h * stride_ah + s * stride_as
            tl.store(ACC + out + rows[:, None] * stride_am + d[None, :], acc)
            stats = b * stride_mb + h * stride_mh + s * stride_ms + rows
            tl.store(M_OUT + stats, m_i)
            tl.store(L_OUT + stats, l_i)

    @triton.jit
    def _merge_kernel(ACC, M_IN, L_IN, OUT,
                      stride_ab, stride_ah, stride_as, stride_am,
                      stride_mb, stride_mh, stride_ms,
                      stride_ob, stride_oi, stride_oh,
                      splits,
                      QMAX: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                      D: tl.constexpr):
        """out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, written in the queries'
        layout and dtype. Every row sees key 0 in split 0, so M is finite; a split that saw
        nothing has m = -inf and weight 0."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        rows = tl.arange(0, ROWS)
        d = tl.arange(0, D)
        stats = M_IN + b * stride_mb + h * stride_mh + rows
        top = tl.full([ROWS], float("-inf"), tl.float32)
        for s in range(0, splits):
            top = tl.maximum(top, tl.load(stats + s * stride_ms))
        total = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        for s in range(0, splits):
            weight = tl.exp(tl.load(stats + s * stride_ms) - top)
            total += weight * tl.load(L_IN + b * stride_mb + h * stride_mh + s * stride_ms + rows)
            acc += weight[:, None] * tl.load(ACC + b * stride_ab + h * stride_ah + s * stride_as
                                             + rows[:, None] * stride_am + d[None, :])
        g = rows // QMAX
        i = rows % QMAX
        real = rows < GROUP * QMAX
        tl.store(OUT + b * stride_ob + i[:, None] * stride_oi + (h * GROUP + g)[:, None]
                 * stride_oh + d[None, :], (acc / total[:, None]).to(OUT.dtype.element_ty),
                 mask=real[:, None])


if triton is not None:

    @triton.jit
    def _store_kernel(K_NEW, V_NEW, K_CACHE, V_CACHE, SLOTS,
                      stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                      D: tl.constexpr):
        """Token t's K and V of KV head h into slot SLOTS[t] of both caches."""
        t = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, D)
        slot = tl.load(SLOTS + t)
        cache = slot * stride_cs + h * stride_ch + d
        tl.store(K_CACHE + cache, tl.load(K_NEW + t * stride_kt + h * stride_kh + d))
        tl.store(V_CACHE + cache, tl.load(V_NEW + t * stride_vt + h * stride_vh + d))


def store_kv(keys: torch.Tensor, values: torch.Tensor, key_cache: torch.Tensor,
             value_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """New K and V [tokens, kv_heads, d] into their slots of [slots, kv_heads, d] caches in one
    launch (two `index_copy_` otherwise). `d` must be a power of two (64, 128: Llama's)."""
    tokens, kv_heads, d = keys.shape
    if key_cache.stride(2) != 1 or keys.stride(2) != 1 or values.stride(2) != 1:
        raise ValueError("store_kv needs the head dimension contiguous")
    _store_kernel[(tokens, kv_heads)](
        keys, values, key_cache, value_cache, slots,
        keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
        key_cache.stride(0), key_cache.stride(1), D=d)


def splits_for(batch: int, kv_heads: int, width: int, step: int = KEYS_PER_STEP) -> int:
    """Context splits per (request, KV head): enough programs to fill the GPU, at most one per
    loop step of the widest context. Fixed by the shapes alone, so a CUDA graph captures it;
    each request's keys are shared out among the splits at run time, whatever its context."""
    steps = max(1, -(-width // step))
    return max(1, min(steps, -(-TARGET_PROGRAMS // (batch * kv_heads))))


#: launch settings: keys per loop step, warps and pipeline stages per program
#: (scripts/gpu_check.py --tune times the alternatives)
LAUNCH = {"keys_per_step": KEYS_PER_STEP, "num_warps": 4, "num_stages": 2}


def paged_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    t: dict[str, torch.Tensor], qmax: int, block_size: int,
                    launch: dict | None = None) -> torch.Tensor:
    """Packed queries [tokens, heads, d] -> packed output [tokens, heads * d] (see module)."""
    launch = LAUNCH if launch is None else launch
    table, cached = t["table"], t["cached"]
    batch, width = table.shape[0], table.shape[1] * block_size
    heads, d = queries.shape[1:]
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    rows = max(16, triton.next_power_of_2(group * qmax))  # tl.dot needs >= 16 rows
    q = pad_queries(queries, t, batch, qmax)
    step = launch["keys_per_step"]
    splits = splits_for(batch, kv_heads, width, step)
    o = torch.empty(batch, qmax, heads, d, dtype=queries.dtype, device=q.device)
    direct = splits == 1
    shape = (batch, kv_heads, splits, rows)
    if direct:  # nothing to merge: the kernel writes the output (scratch never touched)
        acc = m = lse = o
        strides = (0, 0, 0, 0), (0, 0, 0)
    else:
        acc = torch.empty(*shape, d, dtype=torch.float32, device=q.device)
        m = torch.empty(shape, dtype=torch.float32, device=q.device)
        lse = torch.empty_like(m)
        strides = acc.stride()[:4], m.stride()[:3]
    _split_kernel[(batch, kv_heads, splits)](
        q, keys, values, table, cached, acc, m, lse, o,
        q.stride(0), q.stride(1), q.stride(2),
        keys.stride(0), keys.stride(1),
        table.stride(0),
        *strides[0], *strides[1],
        o.stride(0), o.stride(1), o.stride(2),
        1 / math.sqrt(d), splits, width,
        QMAX=qmax, GROUP=group, ROWS=rows, D=d, BS=block_size, KB=step, DIRECT=direct,
        num_warps=launch["num_warps"], num_stages=launch["num_stages"],
    )
    if not direct:
        _merge_kernel[(batch, kv_heads)](
            acc, m, lse, o, *strides[0], *strides[1], o.stride(0), o.stride(1), o.stride(2),
            splits, QMAX=qmax, GROUP=group, ROWS=rows, D=d)
    return unpad_output(o, t)
