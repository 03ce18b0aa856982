"""The backward pass: gradients of the forward's custom op through csrc/backward/'s kernel.

The forward keeps only O and its LSE. Here: rowsum(dO * O) (less the LSE's own gradient, when the
caller used the LSE), a zeroed fp32 dQ that the kernel's CTAs add their key blocks' shares to, and
dK and dV per query head, summed over each KV head's group (GQA) after the kernel.
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
    deterministic = spec.deterministic
    varlen = cu_seqlens_q is not None
    # the kernel reads dO in 16-byte chunks: rows at multiples of 8 elements, a 16-byte aligned start
    aligned = dout.stride(-1) == 1 and dout.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in dout.stride()[:-1])
    dout = dout if aligned else dout.contiguous()
    # rowsum(dO * O) in the LSE's layout: (batch, heads, seqlen_q), or (heads, total_q) for varlen.
    dsum = (dout.float() * out.float()).sum(-1)
    dsum = dsum.t() if varlen else dsum.transpose(1, 2)
    if dlse is not None:  # the LSE's gradient: d lse / d s = scale * P, one more term of dS
        dsum = dsum - dlse
    dsum = dsum.contiguous()
    lse = lse.contiguous()
    # the atomic adds need zeros; the deterministic dQ kernel stores every row
    dq_accum = (torch.empty if deterministic else torch.zeros)(q.shape, dtype=torch.float32, device=q.device)
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    # varlen k may have rows past the last sequence, which no CTA writes: their gradient is 0
    alloc = torch.zeros if varlen else torch.empty
    dk = alloc((*k.shape[:-2], heads_q, k.shape[-1]), dtype=k.dtype, device=k.device)
    dv = alloc(dk.shape, dtype=v.dtype, device=v.device)
    if poison:  # tests: a row the kernel forgot cannot pass for a computed one
        if not varlen:
            dk.fill_(float("nan"))
            dv.fill_(float("nan"))
        if deterministic:
            dq_accum.fill_(float("nan"))
    kernel = load_kernel(spec)
    load_binding()
    torch.ops.flashtune_C.bwd(kernel.launcher, q, k, v, out, dout, lse, dsum, dq_accum, dk, dv, cu_seqlens_q,
                              cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)
    dq = (dq_accum * softmax_scale).to(q.dtype)
    if heads_q != heads_kv:  # each KV head's gradient is its query heads' sum
        ratio = heads_q // heads_kv
        dk = dk.unflatten(-2, (heads_kv, ratio)).float().sum(-2).to(k.dtype)
        dv = dv.unflatten(-2, (heads_kv, ratio)).float().sum(-2).to(v.dtype)
    return dq, dk, dv
