"""FP8 accuracy measured against the floor the format sets, not a fixed tolerance.

A fixed bar cannot be right for e4m3: its 3-bit mantissa alone costs about 3.6% RMS per element
on random-normal data, and more on data with outliers, which the scales must cover. So every
FP8 path is judged against what the format allows on the same inputs:

    reference = fp32 attention on the original 16-bit inputs
    floor     = error of fp32 attention on the dequantised inputs (what any kernel reading them gets)
    error     = error of the kernel's output
    bar       = error <= 1.1 x floor + 1e-3   (relative L2 errors against the reference)

Inputs come random-normal and shaped like real activations: keys with a few channels offset by
5-10 standard deviations (as LLM keys have: the offsets set the scale and coarsen every other
channel), queries with a few outlier tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtune.measure.reference import attention_reference, rel_l2

FLOOR_FACTOR = 1.1
FLOOR_SLACK = 1e-3
INPUT_KINDS = ("normal", "activations")


@dataclass(frozen=True)
class FloorCheck:
    floor: float  # fp32 attention on the dequantised inputs vs on the originals
    error: float  # the kernel's output vs fp32 on the originals

    @property
    def bar(self) -> float:
        return FLOOR_FACTOR * self.floor + FLOOR_SLACK

    @property
    def ok(self) -> bool:
        return self.error <= self.bar


def inputs(kind: str, batch: int, seqlen_q: int, seqlen_k: int, heads: int, heads_kv: int, hdim: int,
           dtype: torch.dtype, device, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) of shape (batch, seqlen, heads, hdim): random-normal, or shaped like LLM
    activations (kind "activations": 4 key channels per KV head offset by 5-10 standard deviations,
    1 query token in 16 scaled by 8)."""
    if kind not in INPUT_KINDS:
        raise ValueError(f"input kind {kind!r}; allowed: {', '.join(INPUT_KINDS)}")

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=generator)

    q, k, v = randn(batch, seqlen_q, heads, hdim), randn(batch, seqlen_k, heads_kv, hdim), randn(
        batch, seqlen_k, heads_kv, hdim)
    if kind == "activations":
        channels = torch.randint(0, hdim, (heads_kv, 4), device=device, generator=generator)
        offsets = 5 + 5 * torch.rand(heads_kv, 4, device=device, generator=generator)
        signs = torch.randint(0, 2, (heads_kv, 4), device=device, generator=generator) * 2 - 1
        shift = torch.zeros(heads_kv, hdim, device=device)
        shift.scatter_(1, channels, offsets * signs)
        k = k + shift  # the same channels of every token
        outliers = torch.rand(batch, seqlen_q, 1, 1, device=device, generator=generator) < 1 / 16
        q = torch.where(outliers, 8 * q, q)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def dequantised(x8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """e4m3 (batch, seqlen, heads_kv, hdim) with (batch, heads_kv) descales -> fp32 values."""
    return x8.float() * descale[:, None, :, None].float()


def kv_cache_check(out: torch.Tensor, q, k, v, k8, v8, k_descale, v_descale, causal: bool,
                   softmax_scale: float | None = None) -> FloorCheck:
    """An e4m3 KV cache's floor and a kernel's error (`out`, (batch, seqlen_q, heads, hdim)) for
    q against k, v (16-bit originals) stored as k8, v8 with their descales."""
    reference, _ = attention_reference(q, k, v, causal, softmax_scale)
    floor_out, _ = attention_reference(q.float(), dequantised(k8, k_descale), dequantised(v8, v_descale), causal,
                                       softmax_scale)
    return FloorCheck(rel_l2(floor_out, reference), rel_l2(out, reference))


# The all-FP8 kernels' bar on their own inputs: this many times P's rounding error, plus the FP8
# kernels' own (verify.FP8_KERNEL_MAX_REL_ERR).
P_ROUNDING_FACTOR = 1.25


def p_rounded_attention(q, k, v, causal: bool, scale: float) -> torch.Tensor:
    """Attention in fp32 with each row's P (exps against the row's maximum, at most 1) rounded to
    e4m3 before P V and the row sums taken before the rounding, as the all-FP8 kernels do: its
    error against plain fp32 attention on the same inputs is what P's rounding alone costs, the
    bar those kernels are held to on their own inputs (tests, `flashtune tune --fp8-all`)."""
    ratio = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(ratio, dim=2).float() for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk) * scale
    if causal:  # bottom-right aligned, as flash_attn
        sq, sk = q.shape[1], k.shape[1]
        row = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > row, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    p = torch.exp(s - m)
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(torch.float8_e4m3fn).float(), vv)
    total = p.sum(dim=-1).transpose(1, 2)[..., None]
    return torch.where(total > 0, out / total.clamp_min(1e-30), torch.zeros_like(out))
