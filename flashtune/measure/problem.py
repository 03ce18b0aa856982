"""The attention problem every measurement is about: a call's shape and dtype. `flashtune bench`
times Problems, `flashtune verify` checks them, the backends run them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# The FlashAttention papers' benchmark grid: seqlen 512-16k, batch = 16384 / seqlen, heads =
# 2048 / head dim (the same tokens and hidden size in every cell).
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (64, 128, 256)
TOKENS_PER_BATCH = 16384  # batch = 16384 // seqlen
HIDDEN = 2048  # heads = 2048 // hdim


@dataclass(frozen=True)
class Problem:
    dtype: str  # "float16" or "bfloat16" (v's and the output's)
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int = 2
    heads: int = 8
    heads_kv: int = 8  # GQA/MQA: a divisor of heads
    varlen: bool = False  # packed sequences of mixed lengths (verify's case; seqlens unused)
    fp8: bool = False  # q and k quantised to e4m3 by the op (qk_fp8=True)
    fp8_pv: bool = False  # verify's all-FP8 case: v quantised too (pv_fp8=True), with fp8
    page_size: int = 0  # verify's KV-cache case: k and v in shuffled pages of this many keys
    kv_fp8: bool = False  # verify's KV-cache case: k and v stored in e4m3 (per sequence and KV head descales)
    backward: bool = False  # verify's gradient case: dq, dk, dv through the backward kernel
    name: str = ""  # how a report calls it
    window: int = 0  # bench --window: causal, each query sees its own key and the window - 1 before it (0: all)
    hdim_v: int = 0  # bench --hdim-v: V's (and the output's) head dim where it differs from Q/K's (0: the same)

    @property
    def v_dim(self) -> int:
        return self.hdim_v or self.hdim

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.hdim, self.causal,
                               self.window, self.hdim_v)

    @property
    def input_bytes(self) -> int:
        elem = 2
        return elem * self.batch * (self.seqlen_q * self.heads * self.hdim
                                    + self.seqlen_k * self.heads_kv * (self.hdim + self.v_dim))


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool,
                    window: int = 0, hdim_v: int = 0) -> float:
    """4·b·h·sq·sk·d (two matmuls), halved when causal: the FlashAttention papers' count; with a V
    head dim of its own, 2·b·h·sq·sk·(d + d_v). A causal window of fewer keys than the sequence's
    counts only the query-key pairs inside it (the kernel skips the blocks outside)."""
    per_pair = 2.0 * batch * heads * (hdim + (hdim_v or hdim))
    if window and window < seqlen_k:
        return per_pair * window_pairs(seqlen_q, seqlen_k, window)
    flops = per_pair * seqlen_q * seqlen_k
    return flops / 2 if causal else flops


def window_pairs(seqlen_q: int, seqlen_k: int, window: int) -> int:
    """Query-key pairs of one head under a causal window of `window` keys, bottom-right aligned: query
    i sees min(window, i + seqlen_k - seqlen_q + 1) keys (none where that is below 1)."""
    lo, hi = seqlen_k - seqlen_q + 1, seqlen_k  # the keys up to each query's own, first and last query
    first, last = max(lo, 1), min(hi, window)  # the queries whose count is that number, below the window

    def triangle(n: int) -> int:
        return n * (n + 1) // 2

    ramp = triangle(last) - triangle(first - 1) if last >= first else 0
    return ramp + window * max(0, hi - max(lo, window + 1) + 1)


def make_inputs(problem: Problem, seed: int):
    """Fresh random (batch, seqlen, heads, hdim) q, k, v for a fixed-length problem, on the GPU."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, problem.dtype)

    def rand(s, h, d=problem.hdim):
        return torch.randn(problem.batch, s, h, d, device="cuda", dtype=dtype, generator=gen)

    q = rand(problem.seqlen_q, problem.heads)
    return q, rand(problem.seqlen_k, problem.heads_kv), rand(problem.seqlen_k, problem.heads_kv, problem.v_dim)


def fa_grid(seqlens: Iterable[int] = SEQLENS, hdims: Iterable[int] = HDIMS,
            causal: Iterable[bool] = (False, True), dtype: str = "bfloat16", batch: int | None = None,
            heads: int | None = None, heads_kv: int | None = None, window: int = 0,
            hdim_v: int = 0) -> list[Problem]:
    """The FA benchmark grid; batch and heads follow the convention unless given (heads by Q/K's head
    dim). With a window: its causal cells alone, windowed where the sequence is longer than the window
    (else plain causal, which a window that holds every key is). hdim_v: V's head dim, where it differs."""
    shapes = []
    for hdim in hdims:
        for is_causal in causal:
            if window and not is_causal:
                continue
            for s in seqlens:
                b = batch or max(1, TOKENS_PER_BATCH // s)
                h = heads or max(1, HIDDEN // hdim)
                hkv = heads_kv or h
                if h % hkv:
                    raise ValueError(f"--heads-kv {hkv} must divide --heads {h}")
                shapes.append(Problem(dtype, hdim, is_causal, s, s, b, h, hkv, window=window if window < s else 0,
                                      hdim_v=hdim_v if hdim_v != hdim else 0))
    return shapes
