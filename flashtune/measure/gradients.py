"""Gradients judged by FlashAttention's rule: each of dQ, dK and dV within 2x the error that the same
attention computed in the inputs' 16-bit dtype has against the fp32 reference (relative L2, plus
1e-3), and its largest element error within 2x that computation's (plus 1e-2). `flashtune verify`'s
backward rows and the backward GPU tests judge by it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashtune.measure.reference import rel_l2

GRAD_NAMES = ("dq", "dk", "dv")


def same_dtype_attention(q, k, v, causal: bool):
    """Attention in the inputs' dtype (matmuls in it, the softmax in fp32 then rounded), as
    FlashAttention's tests take for the error a 16-bit computation has anyway. (batch, seqlen,
    heads, hdim) inputs, GQA by repeating K/V heads, causal bottom-right aligned."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    kt, vt = (t.repeat_interleave(hq // hkv, dim=1) for t in (kt, vt))
    scores = (qt @ kt.transpose(-1, -2)).float() / math.sqrt(d)
    if causal:
        own = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        scores = scores.masked_fill(torch.arange(sk, device=q.device)[None, :] > own, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0).to(q.dtype)
    return (probs @ vt).transpose(1, 2)


def gradients(fn, inputs, dout) -> list[torch.Tensor]:
    """The gradients of fn(*inputs) against `dout`, on fresh leaf copies of the inputs."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    fn(*inputs).backward(dout)
    return [t.grad for t in inputs]


@dataclass
class GradError:
    name: str
    rel_err: float       # against the fp32 reference
    bar: float           # 2 x the same-dtype computation's relative error + 1e-3
    max_abs: float
    max_abs_bar: float   # 2 x its largest element error + 1e-2
    unwritten: int       # NaN elements (outputs are poisoned before the launch)

    @property
    def ok(self) -> bool:
        return not self.unwritten and self.rel_err <= self.bar and self.max_abs <= self.max_abs_bar


def gradient_errors(ours, ref, lowp, names=GRAD_NAMES) -> list[GradError]:
    """Each gradient of `ours` against the fp32 reference's `ref`, with the bar `lowp` (the same-dtype
    computation's gradients) sets."""
    errors = []
    for name, g, r, low in zip(names, ours, ref, lowp):
        if g.shape != r.shape:
            raise ValueError(f"{name}: shape {tuple(g.shape)}, the reference's {tuple(r.shape)}")
        errors.append(GradError(name, rel_l2(g.float(), r), 2 * rel_l2(low.float(), r) + 1e-3,
                                (g.float() - r).abs().max().item(), 2 * (low.float() - r).abs().max().item() + 1e-2,
                                int(torch.isnan(g).sum())))
    return errors
