"""Every bad input to the attention functions gets a clear error, checked without a GPU.

Device checks run last, so all other errors are reachable with CPU tensors here.
"""
from __future__ import annotations

import pytest
import torch

import flashtune
from flashtune.runtime import ops, selection
from flashtune.kernels.gpu import describe_target
from flashtune.runtime.ops import FlashtuneInputError, flash_attn_func, flash_attn_varlen_func
from flashtune.kernels.profiles import find_profile


def _qkv(b=2, sq=16, sk=16, hq=4, hkv=4, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, d, dtype=dtype))


def _raises(match, fn, *args, **kw):
    with pytest.raises(FlashtuneInputError, match=match):
        fn(*args, **kw)


def test_dtype_rank_shape_and_heads():
    q, k, v = _qkv()
    _raises("dtype torch.float32; allowed: torch.float16, torch.bfloat16", flash_attn_func, q.float(), k, v)
    _raises("must share a dtype", flash_attn_func, q, k.half(), v.half())
    _raises(r"must be \(batch, seqlen, heads, head_dim\)", flash_attn_func, q[0], k, v)
    _raises("k and v must have the same shape", flash_attn_func, q, k, v[:, :8])
    _raises("must share head_dim", flash_attn_func, q, *_qkv(d=128)[1:])
    _raises("must share the batch size", flash_attn_func, q, *_qkv(b=3)[1:])
    q6, k4, v4 = _qkv(hq=6, hkv=4)
    _raises(r"heads of q \(6\) must be a multiple of heads of k/v \(4\)", flash_attn_func, q6, k4, v4)
    _raises("must be a torch.Tensor", flash_attn_func, q.tolist(), k, v)


def test_a_v_head_dim_unlike_qks_is_checked():
    q, k, _ = _qkv(d=192)
    v = torch.randn(2, 16, 4, 264, dtype=torch.bfloat16)
    _raises(r"head dims q/k 192, v 264: each must be a multiple of 8 from 32 to 256", flash_attn_func, q, k, v)
    _raises("k and v must have the same shape but for the head dim", flash_attn_func, q, k, v[:, :8])
    q8, k8 = (t.to(torch.float8_e4m3fn) for t in (q, k))
    _raises("FP8 q/k need v's head dim to be theirs, got 192 and 96", flash_attn_func, q8, k8, v[..., :96].clone())
    v128 = torch.randn(2, 16, 4, 128, dtype=torch.bfloat16, requires_grad=True)
    _raises(r"a V head dim \(128\) unlike Q/K's \(192\) is forward-only", flash_attn_func, q, k, v128)


@pytest.mark.parametrize("hdim", [100, 264, 24])
def test_a_head_dim_that_is_not_served_says_so_before_anything_else(hdim):
    q = torch.zeros(1, 16, 4, hdim, dtype=torch.bfloat16)
    _raises(f"q's head dim {hdim} is not served: head dims are multiples of 8 from 32 to 256", flash_attn_func, q, q, q)
    packed = torch.zeros(16, 4, hdim, dtype=torch.bfloat16)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    _raises(f"q's head dim {hdim} is not served", flash_attn_varlen_func, packed, packed, packed, cu, cu, 16, 16)


def test_s_aux_is_the_sinks_under_vllms_name():
    q, k, v = _qkv()
    _raises("sinks and s_aux are the same argument", flash_attn_func, q, k, v, sinks=torch.zeros(4),
            s_aux=torch.zeros(4))
    _raises(r"sinks must be a float tensor of shape \(heads_q,\) = \(4,\)", flash_attn_func, q, k, v,
            s_aux=torch.zeros(3))
    _raises("on cpu", flash_attn_func, q, k, v, s_aux=torch.zeros(4))  # taken: the device is checked last


def test_strides_and_alignment():
    q, k, v = _qkv()
    _raises("contiguous last dimension", flash_attn_func, q.transpose(-1, -2), k, v)
    wide = torch.randn(2, 16, 4, 70, dtype=torch.bfloat16)[..., :64]  # row stride 70: not 16-byte
    _raises("not multiples of 8 elements", flash_attn_func, wide, k, v)
    offset = torch.randn(2 * 16 * 4 * 64 + 4, dtype=torch.bfloat16)[4:].view(2, 16, 4, 64)
    _raises("storage offset 4", flash_attn_func, offset, k, v)


def test_unsupported_flash_attn_features_are_refused_not_ignored():
    q, k, v = _qkv()
    _raises("dropout is not supported", flash_attn_func, q, k, v, 0.1)
    _raises("each side is a number of keys", flash_attn_func, q, k, v, window_size=(-5, 0))
    _raises("softcap must be a finite number >= 0", flash_attn_func, q, k, v, softcap=-30.0)
    _raises(r"alibi_slopes must be a float32 tensor of shape \(heads,\) or \(batch, heads\)", flash_attn_func, q, k, v,
            alibi_slopes=torch.ones(3))
    _raises("softmax_scale must be a positive finite", flash_attn_func, q, k, v, softmax_scale=-1.0)
    _raises("softmax_scale must be a positive finite", flash_attn_func, q, k, v, softmax_scale=float("nan"))


def test_calls_without_a_backward_say_so_when_grad_is_wanted():
    """What the backward kernel lacks is refused at the forward, before the device is looked at."""
    q, k, v = _qkv()
    q.requires_grad_()
    needs = "needs a backward"
    _raises(f"{needs}.*variants", flash_attn_func, q, k, v, softcap=30.0)
    _raises(f"{needs}.*FP8", flash_attn_func, q, k, v, qk_fp8=True)
    _raises(f"{needs}.*head dim 96", flash_attn_func, *(t.requires_grad_() for t in _qkv(d=96)))
    _raises("is on cpu", flash_attn_func, q, k, v)  # trainable: only the device is left
    with torch.no_grad():
        _raises("is on cpu", flash_attn_func, q, k, v, softcap=30.0)  # no backward asked for
    lens = torch.tensor([0, 3, 8], dtype=torch.int32)
    qv, kv, vv = (t[0, :8] for t in _qkv(d=96))
    _raises(f"{needs}.*head dim 96", flash_attn_varlen_func, qv.requires_grad_(), kv, vv, lens, lens, 5, 5)
    _raises("paged KV-cache call is forward-only", flash_attn_varlen_func, q[0], k[0], v[0], lens, None, 5, 5,
            block_table=torch.zeros(2, 1, dtype=torch.int32))
    _raises("flash_attn_with_kvcache is forward-only", flashtune.flash_attn_with_kvcache, q, k, v)


def test_cpu_tensors_get_a_device_error_last():
    _raises(r"q is on cpu; flashtune runs on CUDA tensors", flash_attn_func, *_qkv())


def _varlen(lens_q=(3, 5), lens_k=(4, 6), h=4, d=64):
    q = torch.randn(sum(lens_q), h, d, dtype=torch.float16)
    k = torch.randn(sum(lens_k), h, d, dtype=torch.float16)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    return q, k, k.clone(), cu(lens_q), cu(lens_k)


def test_varlen_cu_seqlens_checks():
    q, k, v, cu_q, cu_k = _varlen()
    _raises("1-D torch.int32", flash_attn_varlen_func, q, k, v, cu_q.long(), cu_k, 5, 6)
    _raises("start at 0 and never decrease", flash_attn_varlen_func, q, k, v,
            torch.tensor([0, 5, 3], dtype=torch.int32), cu_k, 5, 6)
    _raises(r"cu_seqlens_q\[-1\] = 7 must equal the 8 rows", flash_attn_varlen_func, q, k, v,
            torch.tensor([0, 3, 7], dtype=torch.int32), cu_k, 5, 6)
    _raises(r"cu_seqlens_k\[-1\] = 12 must not exceed the 10 rows", flash_attn_varlen_func, q, k, v, cu_q,
            torch.tensor([0, 4, 12], dtype=torch.int32), 5, 8)
    _raises("more than max_seqlen 4", flash_attn_varlen_func, q, k, v, cu_q, cu_k, 4, 6)
    _raises("same length", flash_attn_varlen_func, q, k, v, cu_q, torch.tensor([0, 10], dtype=torch.int32), 5, 10)
    _raises("with block_table, k is a paged cache", flash_attn_varlen_func, q, k, v, cu_q, cu_k, 5, 6,
            block_table=torch.zeros(1))
    _raises(r"\(total, heads, head_dim\)", flash_attn_varlen_func, q[None], k, v, cu_q, cu_k, 5, 6)
    _raises("q is on cpu", flash_attn_varlen_func, q, k, v, cu_q, cu_k, 5, 6)


def test_spec_choice_errors_name_what_the_profile_serves():
    profile = find_profile("rtx4090")
    with pytest.raises(FlashtuneInputError, match=r"head dim 100 is not served by profile rtx4090 \(its kernels: "
                                                  r"head dims 64, 128, 256; a multiple of 8 from 32 to 256"):
        ops.select_spec(profile, torch.bfloat16, 100, False, 128, 128)
    # between the built head dims: the next one's kernel (the op zero-pads the inputs to it)
    assert ops.select_spec(profile, torch.bfloat16, 96, False, 128, 128).hdim == 128
    assert ops.select_spec(profile, torch.bfloat16, 40, True, 128, 128).hdim == 64
    with pytest.raises(FlashtuneInputError, match="FP8 q/k need head dim 64, 128, 256 exactly, got 96"):
        ops.select_spec(profile, torch.bfloat16, 96, False, 128, 128, fp8=True)
    assert ops.kernel_for(profile, torch.bfloat16, 96, False, 1, 4000, 4).hdim == 96  # decode: computed inside
    spec = ops.select_spec(profile, torch.float16, 128, True, 5000, 5000)
    assert spec.name == "flashtune_fwd_sm80_f16_h128_64x64_w4_s1_c_sm89"


def test_an_sm90_profile_computes_head_dims_above_128_at_its_192_kernel():
    h200, sm80 = find_profile("h200"), find_profile("h200-sm80")
    assert 192 in h200.head_dims and 192 not in sm80.head_dims
    for hdim, built in ((136, 192), (160, 192), (192, 192), (200, 256), (256, 256)):
        spec = ops.select_spec(h200, torch.bfloat16, hdim, True, 4096, 4096)
        assert spec.hdim == built and f"_h{built}_" in spec.name
        assert ops.select_spec(sm80, torch.bfloat16, hdim, True, 4096, 4096).hdim == 256  # the sm80 family has no 192
    with pytest.raises(FlashtuneInputError, match="FP8 q/k need head dim 64, 128, 256 exactly, got 192"):
        ops.select_spec(h200, torch.bfloat16, 192, False, 512, 512, fp8=True)
    decode = ops.kernel_for(h200, torch.bfloat16, 192, False, 1, 4000, 4)
    assert decode.hdim == 192 and decode.tile == h200.decode_tile(256, decode.tile.rows)  # computed at 256 inside


@pytest.mark.parametrize("profile_name, dtype, width", [("h200-sm80", torch.bfloat16, 256), ("h200", "e4m3", 256)])
def test_an_unlike_v_head_dim_pads_to_the_profiles_built_size(monkeypatch, profile_name, dtype, width):
    """DeepSeek's MLA prefill, Q/K 192 and V 128, where no narrow kernel serves (the sm80 family, e4m3 q/k):
    all three zero-padded to one built head dim (256: neither has a 192 kernel), the output cut back to V's."""
    from flashtune.runtime.checks import FP8

    seen = []
    monkeypatch.setattr(ops, "active_profile", lambda device: find_profile(profile_name))
    monkeypatch.setattr(ops, "run_spec", lambda spec, q, k, v, *rest, **kw: (
        seen.append((spec.hdim, q.shape[-1], v.shape[-1], spec.fp8)) or torch.zeros(*q.shape[:-1], v.shape[-1]),
        torch.zeros(1)))
    qk_dtype = FP8 if dtype == "e4m3" else dtype
    q, k = torch.zeros(1, 300, 4, 192).to(qk_dtype), torch.zeros(1, 300, 4, 192).to(qk_dtype)
    v = torch.zeros(1, 300, 4, 128, dtype=torch.bfloat16)
    out, _ = ops._attention_fwd(q, k, v, None, None, 300, 300, 0.1, True, torch.ones(1, 4), torch.ones(1, 4))
    assert seen == [(width, width, width, dtype == "e4m3")] and out.shape[-1] == 128


@pytest.mark.parametrize("hdim, hdim_v, seqlen_q, expected", [
    (96, None, 4096, "flashtune_fwd_sm90_bf16_h128_128x176_wg2_s2_c_narrow_sm90a"),  # Phi-3's, at 128 in place
    (192, 128, 4096, "flashtune_fwd_sm90_bf16_h192v128_128x112_wg2_s2_c_sm90a"),     # DeepSeek's MLA prefill
    (128, 64, 4096, "flashtune_fwd_sm90_bf16_h128v64_128x176_wg2_s2_c_sm90a"),        # V's own panels only
    (192, 120, 4096, "flashtune_fwd_sm90_bf16_h192v128_128x112_wg2_s2_c_narrow_sm90a"),  # and V narrow in them
    (64, 128, 4096, "flashtune_fwd_sm90_bf16_h128_128x176_wg2_s2_c_narrow_sm90a"),     # V wider: at V's
    (256, 128, 4096, "flashtune_fwd_sm90_bf16_h256_128x80_wg2_s2_c_narrow_sm90a"),     # a pair not built: narrow
    (128, None, 4096, "flashtune_fwd_sm90_bf16_h128_128x176_wg2_s2_c_sm90a"),        # a built head dim: the plain one
    (96, None, 1, "flashtune_decode_bf16_h96_"),                                      # decode: its own kernels
])
def test_an_sm90_profile_reads_head_dims_between_the_built_ones_in_place(hdim, hdim_v, seqlen_q, expected):
    spec = ops.kernel_for(find_profile("h200"), torch.bfloat16, hdim, True, seqlen_q, 4096, hdim_v=hdim_v)
    assert spec.name.startswith(expected)
    sm80 = ops.kernel_for(find_profile("h200-sm80"), torch.bfloat16, 96, True, 4096, 4096)
    assert not sm80.narrow and sm80.hdim == 128  # the sm80 family: the op pads copies
    with pytest.raises(FlashtuneInputError, match="unlike Q/K's .* narrow prefill kernel"):
        ops.kernel_for(find_profile("h200-sm80"), torch.bfloat16, 192, True, 4096, 4096, hdim_v=128)


@pytest.mark.parametrize("profile_name, hdim_v, padded", [("h200", 96, None), ("h200", 64, None),
                                                           ("h200-sm80", 96, 128), ("h200-sm80", 64, 128)])
def test_the_op_pads_copies_only_where_no_narrow_kernel_serves(monkeypatch, profile_name, hdim_v, padded):
    """q/k of head dim 96 (and v of 96, or 64): an sm90 profile's narrow kernel gets the tensors as they
    are; the sm80 family gets copies zero-padded to 128, and its output cut back to v's."""
    seen = []
    monkeypatch.setattr(ops, "active_profile", lambda device: find_profile(profile_name))
    monkeypatch.setattr(ops, "run_spec", lambda spec, q, k, v, *rest, **kw: (
        seen.append((spec.narrow, q.shape[-1], k.shape[-1], v.shape[-1])) or torch.zeros(*q.shape[:-1], v.shape[-1]),
        torch.zeros(1)))
    q, k, v = torch.zeros(1, 300, 4, 96), torch.zeros(1, 300, 4, 96), torch.zeros(1, 300, 4, hdim_v)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    out, _ = ops._attention_fwd(q, k, v, None, None, 300, 300, 0.1, True)
    assert seen == ([(True, 96, 96, hdim_v)] if padded is None else [(False, padded, padded, padded)])
    assert out.shape[-1] == hdim_v
    seen.clear()  # a broadcast k (no tensor map describes a stride of 0): padded copies on every profile
    ops._attention_fwd(q, k[:, :, :1].expand(k.shape), v, None, None, 300, 300, 0.1, True)
    assert seen == [(False, 128, 128, 128)]


def test_a_profile_for_another_arch_is_refused_on_this_gpu():
    h200 = describe_target(gpu_name="H200")
    selection.check_runs_on(find_profile("h200-sm80"), h200)  # sm_90 SASS runs on 9.0
    with pytest.raises(FlashtuneInputError, match="builds for sm_89, which cannot run on"):
        selection.check_runs_on(find_profile("rtx4090"), h200)
    with pytest.raises(FlashtuneInputError, match="builds for sm_120"):
        selection.check_runs_on(find_profile("rtx5090"), describe_target(gpu_name="RTX 4090"))
    selection.check_runs_on(find_profile("rtx3090"), describe_target(gpu_name="RTX 4090"))  # sm_86 SASS on 8.9


def test_strides_of_size_one_dimensions_do_not_matter():
    q = torch.randn(1, 16, 4, 64, dtype=torch.bfloat16).as_strided((1, 16, 4, 64), (3, 256, 64, 1))
    k = v = torch.randn(1, 16, 4, 64, dtype=torch.bfloat16)
    _raises("is on cpu", flash_attn_func, q, k, v)  # batch stride 3 is fine: past the stride check


def test_fp8_arguments_are_checked_before_any_launch():
    b, s, h, d = 2, 16, 4, 64
    q8 = torch.zeros(b, s, h, d).to(torch.float8_e4m3fn)
    k8 = torch.zeros(b, s, 2, d).to(torch.float8_e4m3fn)
    v = torch.zeros(b, s, 2, d, dtype=torch.bfloat16)
    q16, k16 = q8.to(torch.bfloat16), k8.to(torch.bfloat16)
    cases = [
        (lambda: flash_attn_func(q8, k16, v), "both q and k in torch.float8_e4m3fn"),
        (lambda: flash_attn_func(q16, k16, v.to(torch.float8_e4m3fn)), "all-FP8 kernel, which takes e4m3 q and k"),
        (lambda: flash_attn_func(q16, k16, v, pv_fp8=True), "pass qk_fp8=True with it"),
        (lambda: flash_attn_func(q8, k8, v, pv_fp8=True), "drop it and pass an e4m3 v"),
        (lambda: flash_attn_func(q16, k16, v, v_descale=torch.ones(b, 2)), "v_descale scales an e4m3 v"),
        (lambda: flash_attn_func(q16, k16, v, qk_fp8=True, pv_fp8=True, v_descale=torch.ones(b, 2)),
         "computes v's descale"),
        (lambda: flash_attn_func(q8, k8, v.to(torch.float8_e4m3fn), v_descale=torch.ones(b, h)),
         r"v_descale must be .*\(2, 2\)"),
        (lambda: flash_attn_func(q16, k16, v, q_descale=torch.ones(b, 2)), "pass qk_fp8=True"),
        (lambda: flash_attn_func(q8, k8, v, qk_fp8=True), "already torch.float8_e4m3fn"),
        (lambda: flash_attn_func(q16, k16, v, qk_fp8=True, k_descale=torch.ones(b, 2)), "computes its own descales"),
        (lambda: flash_attn_func(q8, k8, v, q_descale=torch.ones(b, h)), r"\(batch, heads_kv\) = \(2, 2\)"),
        (lambda: flash_attn_func(q8, k8, v, k_descale=torch.ones(b, 2, dtype=torch.float64)), "float32"),
        (lambda: flash_attn_varlen_func(q8[0], k8[0], v[0], *[torch.tensor([0, s], dtype=torch.int32)] * 2,
                                                  s, s), "not the varlen one"),
        (lambda: flash_attn_func(q8, k8, v, q_descale=torch.ones(b, 2)), "is on cpu"),  # last: device
    ]
    for call, message in cases:
        with pytest.raises(FlashtuneInputError, match=message):
            call()


def test_fp8_needs_fp8_tensor_cores_and_an_fp8_profile(tmp_path):
    import yaml

    with pytest.raises(FlashtuneInputError, match="sm_80 .*lacks"):
        ops.select_spec(find_profile("a100"), torch.bfloat16, 128, False, 512, 512, fp8=True)
    data = yaml.safe_load(find_profile("rtx4090").path.read_text())
    data.update(name="no-fp8", fp8=None)
    (tmp_path / "no-fp8.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(FlashtuneInputError, match="no-fp8 has no FP8 kernels"):
        ops.select_spec(find_profile(str(tmp_path / "no-fp8.yaml")), torch.bfloat16, 128, False, 512, 512, fp8=True)
    spec = ops.select_spec(find_profile("h200"), torch.bfloat16, 128, False, 512, 512, fp8=True)
    assert spec.fp8 and spec.name.endswith("_fp8qk_sm90a")


def test_quantise_qk_is_per_batch_and_kv_head():
    torch.manual_seed(0)
    # q heads 0,1 share kv head 0 and heads 2,3 kv head 1: scale heads 2,3 and batch 1 up
    q = torch.randn(2, 33, 4, 64) * torch.tensor([1.0, 10.0])[:, None, None, None] \
        * torch.tensor([1.0, 1.0, 10.0, 10.0])[None, None, :, None]
    k = torch.randn(2, 40, 2, 64) * torch.tensor([1.0, 20.0])[None, None, :, None]
    q8, k8, q_descale, k_descale = ops.quantise_qk(q, k, heads_kv=2)
    assert q8.dtype == k8.dtype == torch.float8_e4m3fn and q_descale.shape == k_descale.shape == (2, 2)
    assert q_descale[1, 0] > 5 * q_descale[0, 0] and (q_descale[:, 1] > 5 * q_descale[:, 0]).all()
    assert (k_descale[:, 1] > 10 * k_descale[:, 0]).all()
    q_back = q8.float() * q_descale.repeat_interleave(2, dim=1)[:, None, :, None]
    k_back = k8.float() * k_descale[:, None, :, None]
    for x, back in ((q, q_back), (k, k_back)):
        assert (back - x).norm() / x.norm() < 0.05
    assert q8.float().abs().max() <= 448 and k8.float().abs().max() <= 448
    empty8, _, empty_descale, _ = ops.quantise_qk(q[:, :0], k, heads_kv=2)  # seqlen 0: no crash
    assert empty8.shape == (2, 0, 4, 64) and torch.equal(empty_descale, torch.ones(2, 2))
    with pytest.raises(FlashtuneInputError, match="multiple of heads_kv"):
        ops.quantise_qk(q, k, heads_kv=3)


def test_scale_and_cu_seqlens_errors_say_what_they_got():
    from flashtune.runtime import checks

    with pytest.raises(FlashtuneInputError, match="softmax_scale must be a positive finite number, got a"):
        checks.scale_for("a", 64)
    with pytest.raises(FlashtuneInputError, match="got a 1-D torch.int64 tensor"):
        checks.check_cu_seqlens(torch.zeros(3, dtype=torch.int64), "cu_seqlens_q", 3, 3, True)
