"""A V head dim unlike Q/K's (DeepSeek's MLA prefill: 192/128; 128/64), on the GPU: flash_attn_func
in prefill and decode lengths, causal and not, GQA, and flash_attn_varlen_func, against the fp32
reference, outputs poisoned first, fresh random inputs each case; under the profile the run selects
(FLASHTUNE_PROFILE=h200-sm80 as well). On an sm90 profile in prefill a V head dim below Q/K's has a
kernel of its own (192/128: `..._h192v128_...`), a larger one the narrow kernel at Q/K's; else q, k
and v are zero-padded to one built head dim."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned", "run_profile")]

import flashtune  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402

DEV = "cuda"


def randn(*shape, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)


@pytest.mark.parametrize("dqk,dv", [(192, 128), (128, 64), (64, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(300, 300), (1, 700), (4, 257), (129, 64)])
def test_outputs_match_the_fp32_reference(dqk, dv, causal, seqlen_q, seqlen_k):
    seed = dqk + dv + seqlen_q + seqlen_k + causal
    q = randn(2, seqlen_q, 8, dqk, seed=seed)
    k = randn(2, seqlen_k, 2, dqk, seed=seed + 1)
    v = randn(2, seqlen_k, 2, dv, seed=seed + 2)
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal)
    assert out.shape == (2, seqlen_q, 8, dv) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert rel_l2(out.float(), ref) < 1e-2
    seen = torch.isfinite(ref_lse)
    assert torch.allclose(lse[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    from flashtune.runtime import ops

    profile = ops.active_profile(q.device)
    if seqlen_q > 16 and profile.family == "sm90":  # prefill in place: the kernel that ran is the one chosen
        from flashtune.measure.timing import kernel_names

        spec = ops.kernel_for(profile, q.dtype, dqk, causal, seqlen_q, seqlen_k, 4, hdim_v=dv)
        assert bool(spec.hdim_v) == (dv < dqk)  # V's own head dim below Q/K's; above, the narrow kernel at V's
        ours = [n for n in kernel_names(lambda: flashtune.flash_attn_func(q, k, v, causal=causal))
                if n.startswith("flashtune_")]
        assert ours == [spec.name]


def test_varlen_with_a_v_head_dim_unlike_qks():
    lens_q, lens_k = [5, 0, 130, 64], [9, 3, 200, 70]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    q, k, v = randn(sum(lens_q), 4, 192, seed=1), randn(sum(lens_k), 2, 192, seed=2), randn(sum(lens_k), 2, 128, seed=3)
    out = flashtune.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    assert out.shape == (sum(lens_q), 4, 128)
    for i in range(len(lens_q)):
        if lens_q[i] == 0:
            continue
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        ref, _ = attention_reference(q[qs][None], k[ks][None], v[ks][None], True)
        assert rel_l2(out[qs].float(), ref[0]) < 1e-2, i
