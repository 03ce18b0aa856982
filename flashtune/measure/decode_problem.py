"""The decode problem `flashtune bench --decode` times: a few query tokens per sequence against a
KV cache (contiguous, or paged with a shuffled block table), and its default grid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

DECODE_HDIMS = (64, 128, 256)
DECODE_HEADS = 32
DECODE_HEADS_KV = (1, 8, 32)
DECODE_BATCHES = (1, 8, 32, 128)
DECODE_CACHES = (1024, 16384, 131072)
DECODE_SEQLENS_Q = (1, 4)  # one token, and speculative decoding's four (causal)
DECODE_PAGES = (0, 1, 16, 64, 256)  # 0: contiguous
# Cells whose K/V would not leave room for SDPA's GQA-repeated copy on an 80-141 GB card are left out.
MAX_KV_BYTES = 32 * 2**30


@dataclass(frozen=True)
class DecodeProblem:
    dtype: str
    hdim: int
    heads: int
    heads_kv: int
    batch: int
    cache: int       # keys per sequence (every sequence's cache is full)
    seqlen_q: int    # query tokens per sequence; causal (bottom-right) when above 1
    page_size: int = 0  # 0: contiguous cache

    @property
    def causal(self) -> bool:
        return self.seqlen_q > 1

    @property
    def kv_bytes(self) -> int:
        """The bytes of K and V a call must read: the measure of a memory-bound step."""
        return 2 * self.batch * self.cache * self.heads_kv * self.hdim * 2

    @property
    def label(self) -> str:
        pages = f" pages {self.page_size}" if self.page_size else ""
        return (f"{self.dtype} hdim {self.hdim} {self.heads}/{self.heads_kv} heads b{self.batch} cache {self.cache} "
                f"q{self.seqlen_q}{pages}")


def decode_grid(hdims: Iterable[int] = DECODE_HDIMS, heads_kv: Iterable[int] = DECODE_HEADS_KV,
                batches: Iterable[int] = DECODE_BATCHES, caches: Iterable[int] = DECODE_CACHES,
                seqlens_q: Iterable[int] = DECODE_SEQLENS_Q, pages: Iterable[int] = (0,), dtype: str = "bfloat16",
                heads: int = DECODE_HEADS, max_kv_bytes: int = MAX_KV_BYTES) -> tuple[list[DecodeProblem], int]:
    """Every combination, and how many were left out for their size (over max_kv_bytes)."""
    problems, too_big = [], 0
    for hdim in hdims:
        for hkv in heads_kv:
            if heads % hkv:
                raise ValueError(f"--heads-kv {hkv} must divide the {heads} query heads")
            for batch in batches:
                for cache in caches:
                    for sq in seqlens_q:
                        for page in pages:
                            p = DecodeProblem(dtype, hdim, heads, hkv, batch, cache, sq, page)
                            if page and cache % page:
                                raise ValueError(f"cache {cache} is not a multiple of page size {page}")
                            if p.kv_bytes > max_kv_bytes:
                                too_big += 1
                            else:
                                problems.append(p)
    return problems, too_big


def make_decode_inputs(problem: DecodeProblem, seed: int) -> dict:
    """Fresh random q and a full cache on the GPU; paged: the same number of pages, shuffled in a
    block table, as an engine's allocator leaves them."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, problem.dtype)
    p = problem
    q = torch.randn(p.batch, p.seqlen_q, p.heads, p.hdim, device="cuda", dtype=dtype, generator=gen)
    if not p.page_size:
        shape = (p.batch, p.cache, p.heads_kv, p.hdim)
        return dict(q=q, k=torch.randn(shape, device="cuda", dtype=dtype, generator=gen),
                    v=torch.randn(shape, device="cuda", dtype=dtype, generator=gen), block_table=None)
    pages = p.batch * p.cache // p.page_size
    shape = (pages, p.page_size, p.heads_kv, p.hdim)
    table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(p.batch, -1)
    return dict(q=q, k=torch.randn(shape, device="cuda", dtype=dtype, generator=gen),
                v=torch.randn(shape, device="cuda", dtype=dtype, generator=gen), block_table=table)


def contiguous_kv(inputs: dict, sequences: int | None = None):
    """The cache as (batch, cache, heads_kv, hdim) K and V, gathered through the block table if paged;
    only the first `sequences` of them when given."""
    k, v, table = inputs["k"], inputs["v"], inputs["block_table"]
    if table is None:
        return (k, v) if sequences is None else (k[:sequences], v[:sequences])
    table = table if sequences is None else table[:sequences]
    batch = table.shape[0]
    rows = table.long()
    return (k[rows].reshape(batch, -1, *k.shape[2:]), v[rows].reshape(batch, -1, *v.shape[2:]))
