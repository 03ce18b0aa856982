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
