"""The fp32 reference every correctness check compares against, and the error metric.

Plain PyTorch math in float32 (float64 for float64 inputs: gradcheck's) with flashtune's conventions:
bottom-right causal alignment, GQA by head grouping, and rows that see no key give O = 0 and LSE = +inf
(flash_attn's convention).
"""
from __future__ import annotations

import math

import torch


def visible_keys(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool, True where a query sees a key: up to its own key when causal, and within
    window (left, right) keys of it (-1: unbounded), its own key bottom-right aligned (flash_attn's masks)."""
    own = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    left, right = window
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        keep &= cols <= own
    if left >= 0:
        keep &= cols >= own - left
    if right >= 0:
        keep &= cols <= own + right
    return keep


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        softmax_scale: float | None = None, window: tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, sinks: torch.Tensor | None = None,
                        alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, seqlen, heads, d) inputs -> (out fp32 (b, sq, h, d), lse fp32 (b, h, sq)); float64 in, float64 out.

    Variants as flash_attn and vLLM define them: window (left, right) keys around each query's own
    position (bottom-right aligned; -1: unbounded), softcap (scaled scores -> softcap x
    tanh(scores / softcap)), sinks (heads,): a logit per head joining every row's softmax, with
    no value (the LSE includes it; a row that sees no key then has LSE = its sink), alibi_slopes
    (heads,) or (batch, heads): -slope * |i + seqlen_k - seqlen_q - j| added after the softcap."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = q.to(wide).transpose(1, 2)  # (b, h, sq, d)
    kf = k.to(wide).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vf = v.to(wide).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        own = torch.arange(sq, device=q.device)[:, None] + (sk - sq)  # each query's own key, bottom-right aligned
        slopes = alibi_slopes.to(q.device, wide).expand(b, hq)[:, :, None, None]
        scores = scores - slopes * (own - torch.arange(sk, device=q.device)[None, :]).abs().to(wide)
    scores = scores.masked_fill(~visible_keys(sq, sk, causal, window, q.device), float("-inf"))
    if sinks is not None:  # one more column per head: the sink, with a zero value row
        sink_col = sinks.to(q.device, wide)[None, :, None, None].expand(b, hq, sq, 1)
        scores = torch.cat([scores, sink_col], dim=-1)
        vf = torch.cat([vf, vf.new_zeros(b, hq, 1, d)], dim=2)
    lse = torch.logsumexp(scores, dim=-1)  # -inf for rows that see no key
    probs = torch.exp(scores - lse[..., None].clamp_min(torch.finfo(wide).min))
    probs = torch.nan_to_num(probs, nan=0.0)
    out = torch.matmul(probs, vf).transpose(1, 2)
    if sk == 0:
        out = torch.zeros_like(out)
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, softmax_scale=None, window=(-1, -1),
                     softcap=0.0, sinks=None, alibi_slopes=None):
    """Packed (total, h, d) inputs -> (out fp32 (total_q, h, d), lse fp32 (h, total_q))."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for i in range(len(cq) - 1):
        qs, ks = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]]
        vs = v[ck[i]:ck[i + 1]]
        slopes = alibi_slopes[i] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, l = attention_reference(qs[None], ks[None], vs[None], causal, softmax_scale, window, softcap, sinks, slopes)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; NaN anywhere in x gives inf (never passes)."""
    x, ref = x.double(), ref.double()
    if torch.isnan(x).any():
        return float("inf")
    denom = ref.norm().item()
    diff = (x - ref).norm().item()
    return diff / denom if denom > 0 else diff
