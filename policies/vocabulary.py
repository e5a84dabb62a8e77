"""The speculation vocabulary, defined once (see docs/design.md "Vocabulary").

- `k`: draft tokens proposed for one request in one step; k = 0 is plain decoding.
- `accepted`: drafts accepted in a step (0..k);
  `emitted = accepted + 1` (the bonus or corrected token).
- `alpha`: per-token acceptance probability of the i.i.d. model; accepted/drafted is *not* alpha.
"""

from __future__ import annotations

import math


def expected_emitted(alpha: float, k: int) -> float:
    """E[emitted] of one step drafting k, i.i.d. acceptance alpha (Leviathan et al. 2023).

    E(k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha); E(0) = 1.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_accepted(alpha: float, k: int) -> float:
    """E[accepted] = E[emitted] - 1 = alpha (1 - alpha^k) / (1 - alpha)."""
    return expected_emitted(alpha, k) - 1.0


def alpha_from_mean_accepted(mean_accepted: float, k: int, tol: float = 1e-10) -> float:
    """Invert E[accepted](alpha, k) = mean_accepted by bisection (it is increasing in alpha).

    Engines report accepted/drafted, under i.i.d. alpha(1 - alpha^k)/((1 - alpha) k) < alpha;
    this recovers alpha itself. Clamped to [0, 1] at the ends.
    """
    if k <= 0:
        raise ValueError(f"k must be >= 1 to estimate alpha, got {k}")
    if mean_accepted <= 0.0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_accepted(mid, k) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Speedup over plain decoding: E(k) / (k·c + 1), c = draft pass / target pass."""
    if cost_ratio < 0 or math.isnan(cost_ratio):
        raise ValueError(f"cost ratio must be >= 0, got {cost_ratio}")
    return expected_emitted(alpha, k) / (k * cost_ratio + 1.0)
