"""flash_attn's packed calls: q, k and v (or k and v) stacked in one tensor, as a model's fused QKV
projection writes them (Hugging Face's and NeMo's training paths call these).

Each takes views of its packed tensor along the stacking axis and hands them to `flash_attn_func` /
`flash_attn_varlen_func`, whose kernels read strided inputs in place (no copy into separate
tensors), and whose autograd gives the gradients: the views' dq, dk, dv are stacked back into the
packed tensor's gradient by autograd (one copy, where flash_attn's own backward writes dqkv in
place). Everything else (dtypes, GQA, masks, the variants, deterministic, return_lse) is the
unpacked call's, with its checks and errors.
"""
from __future__ import annotations

import torch

from flashtune.runtime.checks import fail
from flashtune.runtime.ops import flash_attn_func, flash_attn_varlen_func

__all__ = ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]


def _unpack(name: str, packed, count: int, varlen: bool) -> tuple[torch.Tensor, ...]:
    """The `count` views of `packed` along its stacking axis (2, or 1 for varlen), after checking its shape."""
    rank, axis = (4, 1) if varlen else (5, 2)
    rows = "total" if varlen else "batch, seqlen"
    layout = f"({rows}, {count}, heads, head_dim)"
    if not isinstance(packed, torch.Tensor):
        fail(f"{name} must be a torch.Tensor {layout}, got {type(packed).__name__}")
    if packed.dim() != rank or packed.shape[axis] != count:
        batched = varlen and packed.dim() == rank + 1
        call = "flash_attn_varlen_func" if varlen else "flash_attn_func"
        fail(f"{name} must be {layout}, got shape {tuple(packed.shape)}"
             + ("; the varlen call's sequences are packed along one token axis, without a batch axis" if batched
                else f"; for another packing (GQA's q heads beside fewer k/v heads, say), hand views of it to "
                     f"{call} as q, k, v"))
    return packed.unbind(axis)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              *, return_lse=False, sinks=None):
    """`flash_attn_func` on qkv of shape (batch, seqlen, 3, heads, head_dim), as flash_attn's: q, k and v
    share the head count; its gradient is qkv's, (batch, seqlen, 3, heads, head_dim)."""
    q, k, v = _unpack("qkv", qkv, 3, varlen=False)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, sinks=sinks)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                             *, return_lse=False, sinks=None):
    """`flash_attn_func` on q (batch, seqlen_q, heads, head_dim) and kv (batch, seqlen_k, 2, heads_kv,
    head_dim), as flash_attn's; heads_kv may divide heads (GQA/MQA)."""
    k, v = _unpack("kv", kv, 2, varlen=False)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, sinks=sinks)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, return_lse=False, sinks=None):
    """`flash_attn_varlen_func` on qkv of shape (total, 3, heads, head_dim), one int32 `cu_seqlens` for
    queries and keys alike, as flash_attn's."""
    q, k, v = _unpack("qkv", qkv, 3, varlen=True)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  return_lse=return_lse, sinks=sinks)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False,
                                    *, return_lse=False, sinks=None):
    """`flash_attn_varlen_func` on q (total_q, heads, head_dim) and kv (total_k, 2, heads_kv, head_dim),
    as flash_attn's."""
    k, v = _unpack("kv", kv, 2, varlen=True)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, sinks=sinks)
