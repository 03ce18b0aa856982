"""PyTorch's own attention on the same inputs: the error bar flashtune must meet.

Correctness is judged relative to what SDPA's FlashAttention-2 backend achieves on the very
same inputs (with the efficient backend where flash refuses the case, e.g. bottom-right
causal with seqlen_q != seqlen_k), and never looser than the output's own rounding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def sdpa_bottom_right(q, k, v, causal: bool, scale: float, backend: SDPBackend) -> torch.Tensor:
    """SDPA on (b, s, h, d) inputs with flashtune's mask convention; GQA by repeating k/v."""
    hq, hkv = q.shape[2], k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    sq, sk = q.shape[1], k.shape[1]
    mask, is_causal = None, False
    if causal and sq == sk:
        is_causal = True
    elif causal:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(sq, sk)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal, scale=scale)
    return out.transpose(1, 2)


def sdpa_error(q, k, v, causal: bool, scale: float, ref: torch.Tensor) -> tuple[float, str]:
    """(relative L2 error of SDPA against ref, backend used); flash first, then efficient."""
    from flashtune.measure.reference import rel_l2

    for backend, name in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"),
                          (SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient")):
        try:
            out = sdpa_bottom_right(q, k, v, causal, scale, backend)
        except RuntimeError:
            continue
        return rel_l2(out, ref), name
    return float("nan"), "none"


def tolerance(q, k, v, causal: bool, scale: float, ref: torch.Tensor, factor: float = 1.5) -> float:
    """factor x the larger of SDPA's error and the output dtype's own rounding error."""
    from flashtune.measure.reference import rel_l2

    rounding = rel_l2(ref.to(q.dtype), ref)
    sdpa, _ = sdpa_error(q, k, v, causal, scale, ref)
    # A SDPA that fails or returns NaN (e.g. no keys at all) sets no bar: rounding does.
    base = max(rounding, sdpa) if math.isfinite(sdpa) else rounding
    return factor * base
