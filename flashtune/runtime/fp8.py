"""FP8: quantising 16-bit q and k (and, for the all-FP8 kernel, v) to e4m3 with per-(batch, kv head)
descales and the operands an FP8 kernel takes; an e4m3 KV cache's descales and its quantise-on-append.
"""
from __future__ import annotations

import torch

from flashtune.runtime.checks import FP8, FlashtuneInputError

FP8_MAX = 448.0  # the largest finite e4m3 value


def fp8_operands(q, k, q_descale, k_descale, qk_fp8: bool, k_smoothing: bool = False):
    """(q, k, q_descale, k_descale, k_mean) as the kernel takes them (arguments already checked):
    e4m3 q/k with contiguous float32 (batch, heads_kv) descales, or 16-bit q/k with none; k_mean
    (batch, heads_kv, d) float32 when qk_fp8 quantised K smoothed (lse_unsmoothed puts it back in
    the LSE), else None."""
    if q.dtype != FP8:
        if not qk_fp8:
            return q, k, None, None, None
        k_mean = None
        if k_smoothing and k.shape[1]:
            k_mean = k.float().mean(dim=1)  # (batch, heads_kv, d)
            k = (k.float() - k_mean[:, None]).to(k.dtype)
        return (*quantise_qk(q, k, k.shape[2]), k_mean)

    def ones():  # FlashAttention-3's default: no descaling
        return torch.ones(q.shape[0], k.shape[2], dtype=torch.float32, device=q.device)

    return (q, k, ones() if q_descale is None else q_descale.contiguous(),
            ones() if k_descale is None else k_descale.contiguous(), None)


def fp8_v_operand(v, v_descale, pv_fp8: bool):
    """(v, v_descale) as the kernel takes them (arguments already checked): a 16-bit v quantised to
    e4m3 with its descale (pv_fp8), an e4m3 v with its contiguous descale (ones where none was
    given), or a 16-bit v as it is, without one."""
    if pv_fp8:
        return quantise_v(v)
    if v.dtype != FP8:
        return v, None
    if v_descale is None:
        return v, torch.ones(v.shape[0], v.shape[2], dtype=torch.float32, device=v.device)
    return v, v_descale.contiguous()


def quantised_inputs(q, k, v, qk: bool, pv: bool = False) -> tuple[tuple, dict]:
    """16-bit q, k, v as an FP8 model hands them over: q and k (qk) and v too (pv) in e4m3, and their
    per-(batch, kv head) descales as the keyword arguments flash_attn_func and run_spec take."""
    descales = {}
    if qk:
        q, k, descales["q_descale"], descales["k_descale"] = quantise_qk(q, k, k.shape[2])
    if pv:
        v, descales["v_descale"] = quantise_v(v)
    return (q, k, v), descales


def lse_unsmoothed(lse: torch.Tensor, q: torch.Tensor, k_mean: torch.Tensor, scale: float) -> torch.Tensor:
    """The LSE of the original keys from the LSE of the smoothed ones: smoothing shifted each row's
    scores by -scale * q.mean (the output is unchanged, the LSE moves by that much). lse: (batch,
    heads, seqlen_q); q: 16-bit (batch, seqlen_q, heads, d); k_mean: (batch, heads_kv, d)."""
    ratio = q.shape[2] // k_mean.shape[1]
    shift = torch.einsum("bshd,bhd->bhs", q.float(), k_mean.repeat_interleave(ratio, dim=1))
    return lse + scale * shift


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


def kv_descales(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_descale, v_descale) for an e4m3 KV cache from 16-bit keys and values (batch, seqlen,
    heads_kv, head_dim), e.g. a prompt's: per (batch, KV head) absmax / 448, float32 (batch,
    heads_kv), so those keys and values quantise without saturating. Later keys larger than the
    prompt's saturate at +-448 x descale."""
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise FlashtuneInputError(f"flashtune: kv_descales needs float (batch, seqlen, heads_kv, head_dim) {name}")
    return _absmax_descale(k), _absmax_descale(v)


def _absmax_descale(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads) float32 absmax / 448 of a (batch, seqlen, heads, head_dim) tensor (1 where it is 0)."""
    amax = x.abs().amax(dim=(1, 3)).float() if x.shape[1] else torch.zeros(x.shape[0], x.shape[2], device=x.device)
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quantise_v(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """16-bit (batch, seqlen, heads_kv, head_dim) v -> (v8, v_descale): e4m3 with a per (batch, KV
    head) absmax descale, for the all-FP8 kernel (O = P v8 x v_descale)."""
    descale = _absmax_descale(v)
    return quantise_kv(v, descale), descale


def quantise_kv(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """16-bit (batch, seqlen, heads_kv, head_dim) keys or values -> e4m3 with their sequences'
    (batch, heads_kv) descales, saturating at +-448 (a cast alone would give NaN beyond it)."""
    return (x.float() / descale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
