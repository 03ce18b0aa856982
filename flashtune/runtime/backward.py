"""The backward pass: gradients of the forward's custom op through csrc/backward/'s kernel.

The forward keeps only O and its LSE. One launcher call runs three kernels: a prep pass
(rowsum(dO * O), less the LSE's own gradient when the caller used the LSE, and a zeroed fp32 dQ sum
that the kernel's CTAs add their key blocks' shares to), the kernel, and a finish pass (dQ scaled
and converted); dK and dV come per query head, and with GQA a fourth (the group pass) sums each KV
head's group of query heads.
"""
from __future__ import annotations

import torch

from flashtune.kernels.build import load_binding, load_kernel
from flashtune.kernels.bwd_spec import BWD_HEAD_DIMS, BwdSpec, bwd_spec_for_profile
from flashtune.kernels.spec import DTYPES
from flashtune.runtime.checks import fail
from flashtune.runtime.selection import active_profile

_specs: dict[tuple, BwdSpec] = {}


def trainable_problems(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: bool, variants: bool) -> list[str]:
    """What keeps this call from having a backward (empty: it has one); checked at the forward, so a
    training step fails before its forward runs, not in its backward."""
    problems = []
    if fp8:
        problems.append("FP8 Q/K (qk_fp8 or e4m3 inputs) is forward-only")
    if variants:
        problems.append("the variants (window_size, softcap, sinks, alibi_slopes) are forward-only for now")
    if v.shape[-1] != q.shape[-1]:
        problems.append(f"a V head dim ({v.shape[-1]}) unlike Q/K's ({q.shape[-1]}) is forward-only")
    if q.shape[-1] not in BWD_HEAD_DIMS:
        problems.append(f"head dim {q.shape[-1]}: the backward kernel takes {', '.join(map(str, BWD_HEAD_DIMS))}")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype:
        problems.append(f"{q.dtype}: the backward kernel takes float16 or bfloat16 q, k, v")
    return problems


def check_trainable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: bool = False,
                    variants: bool = False) -> None:
    problems = trainable_problems(q, k, v, fp8, variants)
    if problems:
        fail("this call needs a backward (an input requires grad), which flashtune does not have here: "
             + "; ".join(problems) + ". Run it under torch.no_grad(), or detach the inputs")


def bwd_spec_for(device: torch.device, dtype: torch.dtype, hdim: int, causal: bool,
                 deterministic: bool = False) -> BwdSpec:
    profile = active_profile(device)
    key = (profile.arch.name, profile.nvcc_flags, profile.backward_tile(hdim), dtype, hdim, bool(causal),
           bool(deterministic))
    spec = _specs.get(key)
    if spec is None:
        dtype_name = str(dtype).removeprefix("torch.")
        if dtype_name not in DTYPES:
            fail(f"dtype {dtype_name}: the backward kernel takes {', '.join(DTYPES)}")
        spec = _specs[key] = bwd_spec_for_profile(profile, dtype_name, hdim, causal, deterministic)
    return spec


def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, dlse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                  cu_seqlens_k: torch.Tensor | None, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                  causal: bool, deterministic: bool = False,
                  poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's, k's and v's shapes and dtype; `deterministic`: the same bits for the same
    inputs (dQ summed by a kernel of its own in a fixed order, not by atomic adds)."""
    spec = bwd_spec_for(q.device, q.dtype, q.shape[-1], causal, deterministic)
    return run_bwd_spec(spec, dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, poison)


def run_bwd_spec(spec: BwdSpec, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                 cu_seqlens_k: torch.Tensor | None, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                 poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch exactly `spec` on a validated call (the tuner times candidates through this)."""
    varlen = cu_seqlens_q is not None
    # the kernel reads dO, and the prep pass dO and O, in 16-byte chunks: rows at multiples of 8
    # elements, a 16-byte aligned start
    dout, out = (t if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1])
                 else t.contiguous() for t in (dout, out))
    lse = lse.contiguous()
    # rowsum(dO * O) - dlse in the LSE's layout, (batch, heads, seqlen_q) or (heads, total_q) for
    # varlen, written by the prep pass; dlse, the LSE's gradient (d lse / d s = scale * P), is one
    # more term of dS
    dsum = torch.empty_like(lse)
    dlse = None if dlse is None else dlse.to(torch.float32).expand_as(lse).contiguous()
    dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # zeroed by the prep pass
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # dq_accum's strides (both contiguous)
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    # varlen k may have rows past the last sequence, which no CTA writes: their gradient is 0
    alloc = torch.zeros if varlen else torch.empty
    dk = alloc((*k.shape[:-2], heads_q, k.shape[-1]), dtype=k.dtype, device=k.device)
    dv = alloc(dk.shape, dtype=v.dtype, device=v.device)
    # GQA: each KV head's sum of its query heads' dK and dV, by the group pass
    dk_kv, dv_kv = (torch.empty(k.shape, dtype=t.dtype, device=t.device) for t in (k, v)) if heads_q != heads_kv \
        else (None, None)
    if poison:  # tests: a row the kernels forgot cannot pass for a computed one
        if not varlen:
            dk.fill_(float("nan"))
            dv.fill_(float("nan"))
        for t in (dsum, dq_accum, dq, dk_kv, dv_kv):
            if t is not None:
                t.fill_(float("nan"))
    kernel = load_kernel(spec)
    load_binding()
    torch.ops.flashtune_C.bwd(kernel.launcher, q, k, v, out, dout, lse, dlse, dsum, dq_accum, dq, dk, dv, dk_kv,
                              dv_kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)
    return (dq, dk, dv) if dk_kv is None else (dq, dk_kv, dv_kv)
