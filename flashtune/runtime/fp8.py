"""FP8 Q/K: quantising 16-bit q and k to e4m3 with per-(batch, kv head) descales, and the
operands an FP8 kernel takes.
"""
from __future__ import annotations

import torch

from flashtune.runtime.checks import FP8, FlashtuneInputError

FP8_MAX = 448.0  # the largest finite e4m3 value


def fp8_operands(q, k, q_descale, k_descale, qk_fp8: bool):
    """(q, k, q_descale, k_descale) as the kernel takes them (arguments already checked): e4m3
    q/k with contiguous float32 (batch, heads_kv) descales, or 16-bit q/k with none."""
    if q.dtype != FP8:
        return quantise_qk(q, k, k.shape[2]) if qk_fp8 else (q, k, None, None)

    def ones():  # FlashAttention-3's default: no descaling
        return torch.ones(q.shape[0], k.shape[2], dtype=torch.float32, device=q.device)

    return (q, k, ones() if q_descale is None else q_descale.contiguous(),
            ones() if k_descale is None else k_descale.contiguous())


def quantise_qk(q: torch.Tensor, k: torch.Tensor, heads_kv: int):
    """16-bit (batch, seqlen, heads, d) q, k -> (q8, k8, q_descale, k_descale): per (batch, kv
    head) absmax scaling to e4m3, x = x8 x descale with |x8| <= 448 (a q head shares its kv
    head's factor, as the kernel's descale layout has it)."""
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 4 or heads_kv <= 0 or x.shape[2] % heads_kv:
            raise FlashtuneInputError(f"flashtune: quantise_qk needs (batch, seqlen, heads, head_dim) {name} whose "
                                      f"heads ({x.shape[2] if x.dim() == 4 else '?'}) are a multiple of "
                                      f"heads_kv ({heads_kv})")

    def one(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h, d = x.shape
        if x.numel() == 0:  # an empty sequence: nothing to scale (the kernel sees no rows)
            return x.to(FP8), torch.ones(b, heads_kv, dtype=torch.float32, device=x.device)
        grouped = x.reshape(b, s, heads_kv, h // heads_kv, d)
        amax = grouped.abs().amax(dim=(1, 3, 4)).float()  # (b, heads_kv)
        descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        x8 = (grouped.float() / descale[:, None, :, None, None]).to(FP8).reshape(b, s, h, d)
        return x8, descale

    q8, q_descale = one(q)
    k8, k_descale = one(k)
    return q8, k8, q_descale, k_descale
