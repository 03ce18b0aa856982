"""The backward kernel on the GPU: dQ, dK and dV against the fp32 reference's autograd, with
FlashAttention's rule (each within 2x the error of the same computation in the inputs' dtype, plus a
small absolute term); every dtype and head dim, causal and not, GQA/MQA, seqlen_q != seqlen_k, varlen
with empty sequences, strided inputs, the LSE's own gradient, torch.compile, flash_attn's packed
calls; and on tiny shapes against finite differences of the float64 reference (no autograd on its
side). dK and dV start as NaN; fresh random inputs each case. Under the profile the run selects
(FLASHTUNE_PROFILE=h200-sm80 as well)."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned", "run_profile")]

import flashtune  # noqa: E402
from flashtune.measure.gradients import GRAD_NAMES, gradient_errors, gradients, same_dtype_attention  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2, varlen_reference  # noqa: E402
from flashtune.kernels.bwd_spec import BwdSpec, bwd_spec_of_tile  # noqa: E402
from flashtune.kernels.spec import SpecError  # noqa: E402
from flashtune.runtime import backward  # noqa: E402

DEV = "cuda"


def randn(*shape, seed, dtype):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=g)


def assert_close_grads(ours, ref, lowp, names=GRAD_NAMES):
    for g, l, name in zip(ours, lowp, names):
        assert g.dtype == l.dtype, name
    for e in gradient_errors(ours, ref, lowp, names):
        assert e.ok, e


def cu_seqlens(lens):
    """int32 cumulative lengths, [0, l0, l0 + l1, ...], on the GPU."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,heads_q,heads_kv",
                         [(257, 257, 4, 4), (100, 300, 8, 2), (300, 100, 6, 1), (1, 77, 4, 2), (513, 64, 2, 2)])
def test_gradients_match_the_fp32_reference(dtype, hdim, causal, seqlen_q, seqlen_k, heads_q, heads_kv):
    seed = hdim + seqlen_q + 7 * seqlen_k + heads_q
    q = randn(2, seqlen_q, heads_q, hdim, seed=seed, dtype=dtype)
    k = randn(2, seqlen_k, heads_kv, hdim, seed=seed + 1, dtype=dtype)
    v = randn(2, seqlen_k, heads_kv, hdim, seed=seed + 2, dtype=dtype)
    dout = randn(2, seqlen_q, heads_q, hdim, seed=seed + 3, dtype=dtype)
    ours = gradients(lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in (q, k, v)],
                    dout.float())
    lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), (q, k, v), dout)
    assert_close_grads(ours, ref, lowp)


@pytest.mark.parametrize("hdim", [64, 128])
def test_more_key_blocks_than_the_gpu_has_sms(hdim):
    """4 x 1024 tokens x 16 query heads over 4 KV heads: 512 tiles of 128 keys, more than any GPU has
    SMs, so that a persistent grid's CTA takes several in turn (its K/V, ring and dQ staging carried
    from tile to tile); not causal (by a stride) and causal (from the launch's counter)."""
    dtype = torch.bfloat16
    q, dout = (randn(4, 1024, 16, hdim, seed=hdim + s, dtype=dtype) for s in (0, 1))
    k, v = (randn(4, 1024, 4, hdim, seed=hdim + s, dtype=dtype) for s in (2, 3))
    for causal in (False, True):
        ours = gradients(lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
        ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in (q, k, v)],
                        dout.float())
        lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), (q, k, v), dout)
        assert_close_grads(ours, ref, lowp)


@pytest.mark.parametrize("causal", [False, True])
def test_a_backward_captured_in_a_cuda_graph_replays_on_new_inputs(causal):
    """Forward and backward captured in a CUDA graph, replayed on new inputs three times with the
    gradients poisoned before each replay; eager calls on the capture stream between replays. A
    causal call takes its tiles from a counter the kernels leave at 0; a captured one zeroes a
    counter of its own in the graph."""
    dtype, hdim = torch.bfloat16, 128  # 512 tiles of 128 keys, more than any GPU has SMs: CTAs take several
    q, k, v = (randn(4, 1024, heads, hdim, seed=s, dtype=dtype).requires_grad_()
               for s, heads in ((1, 16), (2, 4), (3, 4)))
    dout = randn(4, 1024, 16, hdim, seed=4, dtype=dtype)

    def step():
        return torch.autograd.grad(flashtune.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture (module loads)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = step()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (10, 20, 30):
        with torch.no_grad():
            for i, t in enumerate((q, k, v, dout)):
                t.copy_(randn(*t.shape, seed=seed + i, dtype=dtype))
            for g in captured:
                g.fill_(float("nan"))
        graph.replay()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager = step()
        torch.cuda.synchronize()
        inputs = [t.detach() for t in (q, k, v)]
        ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in inputs],
                        dout.float())
        lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), inputs, dout)
        assert_close_grads(list(captured), ref, lowp)
        assert_close_grads(list(eager), ref, lowp)


@pytest.mark.parametrize("h, hkv", [(4, 2), (32, 8)], ids=["40-tiles", "320-tiles"])
def test_varlen_gradients_with_empty_sequences_and_padded_keys(h, hkv):
    """320 tiles (2 key blocks x 32 heads x 5 sequences) are more than any GPU has SMs: the wgmma
    kernel's CTAs then take several from its counter, tiles without keys and without queries among them."""
    lens_q, lens_k = [5, 0, 130, 64, 1], [9, 3, 200, 0, 70]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    dtype, d = torch.bfloat16, 128
    q = randn(sum(lens_q), h, d, seed=1, dtype=dtype)
    k = randn(sum(lens_k) + 5, hkv, d, seed=2, dtype=dtype)  # 5 rows past the last sequence
    v = randn(sum(lens_k) + 5, hkv, d, seed=3, dtype=dtype)
    dout = randn(sum(lens_q), h, d, seed=4, dtype=dtype)
    for causal in (False, True):
        ours = gradients(lambda q, k, v: flashtune.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q),
                                                                          max(lens_k), causal=causal),
                         (q, k, v), dout)
        assert torch.equal(ours[1][-5:], torch.zeros_like(ours[1][-5:]))  # padding rows: no gradient
        for i in range(len(lens_q)):
            qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            mine = [ours[0][qs][None], ours[1][ks][None], ours[2][ks][None]]
            if lens_q[i] == 0 or lens_k[i] == 0:  # nothing attends: every gradient is 0
                assert all(torch.count_nonzero(g) == 0 for g in mine), i
                continue
            args = (q[qs][None], k[ks][None], v[ks][None])
            ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in args],
                            dout[qs][None].float())
            lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), args, dout[qs][None])
            assert_close_grads(mine, ref, lowp)


def test_strided_inputs_and_the_lse_gradient():
    """q, k, v as views of one packed qkv tensor; a loss that uses the LSE too."""
    dtype = torch.float16
    qkv = randn(2, 200, 3, 4, 64, seed=5, dtype=dtype)
    dout, dlse = randn(2, 200, 4, 64, seed=6, dtype=dtype), randn(2, 4, 200, seed=7, dtype=torch.float32)

    def loss(attention, qkv):
        out, lse = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
        return (out.float() * dout.float()).sum() + (lse * dlse).sum()

    ours = qkv.detach().clone().requires_grad_()
    loss(lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=True, return_lse=True), ours).backward()
    ref = qkv.detach().float().requires_grad_()
    loss(lambda q, k, v: attention_reference(q, k, v, True), ref).backward()
    assert rel_l2(ours.grad.float(), ref.grad) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,heads_q,heads_kv", [(9, 13, 4, 2), (13, 5, 2, 1)])
def test_gradients_agree_with_finite_differences_of_the_float64_reference(dtype, hdim, causal, seqlen_q, seqlen_k,
                                                                          heads_q, heads_kv):
    """gradcheck's fast mode on tiny shapes, with no autograd on the reference's side: along 64 random
    directions u of each input, the kernel's <grad, u> against central differences of the float64
    reference's loss <dO, O> at the same 16-bit inputs. FlashAttention's rule over the directions:
    the kernel's errors (their L2 norm over the 64) within 2x those of the same attention in the
    inputs' dtype (its gradients by autograd), plus 1e-3 of the differences' norm. (13, 5) causal:
    8 rows that see no key."""
    seed = 3 * hdim + seqlen_q + int(causal)
    q = randn(1, seqlen_q, heads_q, hdim, seed=seed, dtype=dtype)
    k, v = (randn(1, seqlen_k, heads_kv, hdim, seed=seed + s, dtype=dtype) for s in (1, 2))
    dout = randn(1, seqlen_q, heads_q, hdim, seed=seed + 3, dtype=dtype)
    ours = gradients(lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), (q, k, v), dout)
    inputs, dout64 = [t.double() for t in (q, k, v)], dout.double()

    def loss(*xs):
        return (attention_reference(*xs, causal)[0] * dout64).sum()

    eps, g = 1e-4, torch.Generator(device=DEV).manual_seed(seed + 4)
    for i, name in enumerate(GRAD_NAMES):
        directions = torch.randn(64, *inputs[i].shape, dtype=torch.float64, device=DEV, generator=g)

        def moved(step):
            return [x + step if j == i else x for j, x in enumerate(inputs)]
        fd = torch.stack([(loss(*moved(eps * u)) - loss(*moved(-eps * u))) / (2 * eps) for u in directions])

        def error(grad):
            return ((directions * grad.double()).flatten(1).sum(1) - fd).norm().item()
        assert not torch.isnan(ours[i]).any(), name
        assert error(ours[i]) <= 2 * error(lowp[i]) + 1e-3 * fd.norm().item(), (name, error(ours[i]), error(lowp[i]))


def varlen_same_dtype_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal):
    """same_dtype_attention sequence by sequence over packed (total, heads, hdim) inputs."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return torch.cat([same_dtype_attention(q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None],
                                           v[ck[i]:ck[i + 1]][None], causal)[0] for i in range(len(cq) - 1)])


@pytest.mark.parametrize("causal", [False, True])
def test_the_packed_calls_gradients_reach_the_packed_tensors(causal):
    """flash_attn_qkvpacked_func on a fused QKV projection's (batch, seqlen, 3, heads, hdim) and
    flash_attn_kvpacked_func on (batch, seqlen_k, 2, heads_kv, hdim) with GQA 4:1 and seqlen_q !=
    seqlen_k: each packed tensor's gradient, slot by slot, against the reference's on the same views."""
    dtype, d = torch.bfloat16, 128
    qkv, dout = randn(2, 300, 3, 4, d, seed=40, dtype=dtype), randn(2, 300, 4, d, seed=41, dtype=dtype)
    ours = gradients(lambda t: flashtune.flash_attn_qkvpacked_func(t, causal=causal), (qkv,), dout)[0]
    ref = gradients(lambda t: attention_reference(*t.unbind(2), causal)[0], (qkv.float(),), dout.float())[0]
    lowp = gradients(lambda t: same_dtype_attention(*t.unbind(2), causal), (qkv,), dout)[0]
    assert ours.shape == qkv.shape
    assert_close_grads(ours.unbind(2), ref.unbind(2), lowp.unbind(2))

    q, dout = randn(2, 200, 8, d, seed=42, dtype=dtype), randn(2, 200, 8, d, seed=43, dtype=dtype)
    kv = randn(2, 333, 2, 2, d, seed=44, dtype=dtype)
    ours = gradients(lambda q, kv: flashtune.flash_attn_kvpacked_func(q, kv, causal=causal), (q, kv), dout)
    ref = gradients(lambda q, kv: attention_reference(q, *kv.unbind(2), causal)[0], (q.float(), kv.float()),
                    dout.float())
    lowp = gradients(lambda q, kv: same_dtype_attention(q, *kv.unbind(2), causal), (q, kv), dout)
    assert_close_grads([ours[0], *ours[1].unbind(2)], [ref[0], *ref[1].unbind(2)], [lowp[0], *lowp[1].unbind(2)])


@pytest.mark.parametrize("causal", [False, True])
def test_the_varlen_packed_calls_gradients_reach_the_packed_tensors(causal):
    """flash_attn_varlen_qkvpacked_func on (total, 3, heads, hdim) with an empty sequence (hdim 64), and
    flash_attn_varlen_kvpacked_func on (total_k, 2, heads_kv, hdim) with GQA 4:1, other key lengths
    and a sequence without queries (hdim 256)."""
    dtype = torch.bfloat16
    lens = [5, 0, 130, 64]
    cu = cu_seqlens(lens)
    qkv, dout = randn(sum(lens), 3, 4, 64, seed=50, dtype=dtype), randn(sum(lens), 4, 64, seed=51, dtype=dtype)
    ours = gradients(lambda t: flashtune.flash_attn_varlen_qkvpacked_func(t, cu, max(lens), causal=causal),
                     (qkv,), dout)[0]
    ref = gradients(lambda t: varlen_reference(*t.unbind(1), cu, cu, causal)[0], (qkv.float(),), dout.float())[0]
    lowp = gradients(lambda t: varlen_same_dtype_attention(*t.unbind(1), cu, cu, causal), (qkv,), dout)[0]
    assert_close_grads(ours.unbind(1), ref.unbind(1), lowp.unbind(1))

    lens_q, lens_k = [7, 0, 100], [20, 9, 64]
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, dout = (randn(sum(lens_q), 8, 256, seed=s, dtype=dtype) for s in (52, 53))
    kv = randn(sum(lens_k), 2, 2, 256, seed=54, dtype=dtype)

    def ours_fn(q, kv):
        return flashtune.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    ours = gradients(ours_fn, (q, kv), dout)
    ref = gradients(lambda q, kv: varlen_reference(q, *kv.unbind(1), cu_q, cu_k, causal)[0], (q.float(), kv.float()),
                    dout.float())
    lowp = gradients(lambda q, kv: varlen_same_dtype_attention(q, *kv.unbind(1), cu_q, cu_k, causal), (q, kv), dout)
    assert_close_grads([ours[0], *ours[1].unbind(1)], [ref[0], *ref[1].unbind(1)], [lowp[0], *lowp[1].unbind(1)])


def compiled_call(name):
    """A trainable call (flash_attn_<name>), inputs that make it run, and the reference's output from float
    copies of them: the plain ones, the varlen one (lengths 70 and 58) and the packed ones."""
    dtype, d = torch.bfloat16, 64
    cu = cu_seqlens([70, 58])
    q, k, v = (randn(1, 128, 4, d, seed=s, dtype=dtype) for s in (8, 9, 10))
    qkv = randn(1, 128, 3, 4, d, seed=11, dtype=dtype)
    calls = {
        "func": (lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=True), (q, k, v),
                 lambda q, k, v: attention_reference(q, k, v, True)[0]),
        "varlen_func": (lambda q, k, v: flashtune.flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True),
                        (q[0], k[0], v[0]), lambda q, k, v: varlen_reference(q, k, v, cu, cu, True)[0]),
        "qkvpacked_func": (lambda t: flashtune.flash_attn_qkvpacked_func(t, causal=True), (qkv,),
                           lambda t: attention_reference(*t.unbind(2), True)[0]),
        "kvpacked_func": (lambda q, kv: flashtune.flash_attn_kvpacked_func(q, kv, causal=True), (q, qkv[:, :, 1:]),
                          lambda q, kv: attention_reference(q, *kv.unbind(2), True)[0]),
        "varlen_qkvpacked_func": (lambda t: flashtune.flash_attn_varlen_qkvpacked_func(t, cu, 70, causal=True),
                                  (qkv[0],), lambda t: varlen_reference(*t.unbind(1), cu, cu, True)[0]),
        "varlen_kvpacked_func": (
            lambda q, kv: flashtune.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 70, 70, causal=True),
            (q[0], qkv[0, :, 1:]), lambda q, kv: varlen_reference(q, *kv.unbind(1), cu, cu, True)[0]),
    }
    return calls[name]


@pytest.mark.parametrize("name", ["func", "varlen_func", "qkvpacked_func", "kvpacked_func", "varlen_qkvpacked_func",
                                  "varlen_kvpacked_func"])
def test_torch_compile_traces_forward_and_backward_without_graph_breaks(name):
    """Every trainable call under torch.compile(fullgraph=True) (a graph break raises): its forward and
    backward in one compiled step, the gradients against the fp32 reference's."""
    call, inputs, reference = compiled_call(name)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    @torch.compile(fullgraph=True)
    def step(*leaves):
        return call(*leaves).float().square().sum()

    step(*leaves).backward()
    ref = [t.detach().float().requires_grad_() for t in inputs]
    reference(*ref).square().sum().backward()
    for ours, r in zip(leaves, ref):
        assert rel_l2(ours.grad.float(), r.grad) < 2e-2, name


def test_the_backward_kernel_is_the_one_that_runs(monkeypatch):
    """The profile's tile's kernel between its prep and finish passes, and no PyTorch kernel beside
    them (rowsum(dO O), dQ's zeros and its conversion are the passes' work; the LSE's gradient,
    unused here, is not filled in). The tests' NaN fills of the outputs are off: they are launches too."""
    from flashtune.measure.timing import kernel_names
    from flashtune.runtime import ops

    monkeypatch.setattr(ops, "poison_outputs", False)

    q, k, v = (randn(1, 256, 4, 128, seed=s, dtype=torch.bfloat16).requires_grad_() for s in (11, 12, 13))
    out = flashtune.flash_attn_func(q, k, v, causal=True)
    grad = torch.ones_like(out)
    names = kernel_names(lambda: out.backward(grad))
    spec = backward.bwd_spec_for(q.device, torch.bfloat16, 128, True)  # the profile's tile
    assert spec.name.startswith("flashtune_bwd_bf16_h128_") and "_c_" in spec.name
    assert names == spec.launch_order(gqa=False) == [f"{spec.name}_prep", spec.name, f"{spec.name}_finish"], names
    # MQA (the group pass follows), on fresh leaves: a second backward into q.grad would add to it,
    # a PyTorch launch of the test's making
    q = q.detach().requires_grad_()
    k, v = (t.detach()[:, :, :1].clone().requires_grad_() for t in (k, v))
    out = flashtune.flash_attn_func(q, k, v, causal=True)
    names = kernel_names(lambda: out.backward(grad))
    assert names == spec.launch_order(gqa=True) == [f"{spec.name}_prep", spec.name, f"{spec.name}_finish",
                                                     f"{spec.name}_group"], names


@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_every_backward_tile_the_arch_takes_is_right(hdim):
    """What `tune --backward` may write: each tile the active profile's arch takes (on sm_90a the wgmma
    kernel below hdim 256, and mma.sync with 4, 2 and 8 warps; 4 and 8 at 256), causal and not, GQA."""
    from flashtune.runtime.selection import active_profile
    from flashtune.tuning.backward_search import backward_candidates

    profile = active_profile(torch.device(DEV))
    for i, tile in enumerate(backward_candidates(profile, hdim)):
        for causal in (False, True):
            spec = bwd_spec_of_tile(profile.arch.name, "bfloat16", hdim, causal, tile, nvcc_flags=profile.nvcc_flags)
            assert_spec_is_right(spec, seed=100 * i + hdim + causal)


@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_the_other_query_stage_count_is_right(hdim):
    """The mma.sync kernel with the query-block stages its arch does not choose (kQStages): on an
    H100/H200 one stage, what the RTX cards run at hdim 128 and the A100 at 256; 4 warps, and the
    deterministic build."""
    from flashtune.runtime.selection import active_profile

    arch = active_profile(torch.device(DEV)).arch.name
    for deterministic in (False, True):
        for causal in (False, True):
            default = BwdSpec(arch, "bfloat16", hdim, 4, causal, deterministic)
            other = 3 - default.q_stages
            try:
                spec = BwdSpec(arch, "bfloat16", hdim, 4, causal, deterministic, q_stages=other)
            except SpecError:
                continue  # two stages do not fit this arch
            assert f"_q{other}_" in spec.name
            assert_spec_is_right(spec, seed=hdim + 2 * deterministic + causal)


@pytest.mark.parametrize("causal", [False, True])
def test_the_rtx_cards_8_warp_layout_is_right(causal):
    """The 16-key layout's 8 warps at hdim 64 (kTiled false): what the RTX cards' 99 KB take, where
    the H100/H200 and the A100 tile (pinned: `_k16`)."""
    from flashtune.runtime.selection import active_profile

    arch = active_profile(torch.device(DEV)).arch.name
    spec = BwdSpec(arch, "bfloat16", 64, 8, causal, tiled=False)
    if spec.tiled == spec.default_tiled:
        pytest.skip(f"{arch} takes the 16-key layout itself (test_every_backward_tile_is_right runs it)")
    assert "_k16_" in spec.name and spec.block_m == 64
    assert_spec_is_right(spec, seed=64 + causal)


def assert_spec_is_right(spec, seed):
    """One spec's gradients (2 x 333 queries, 6 heads over 2 KV heads and 290 keys) against fp32."""
    hdim, causal, dtype = spec.hdim, spec.causal, torch.bfloat16
    q, dout = (randn(2, 333, 6, hdim, seed=seed + s, dtype=dtype) for s in (0, 1))
    k, v = (randn(2, 290, 2, hdim, seed=seed + s, dtype=dtype) for s in (2, 3))
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ours = backward.run_bwd_spec(spec, dout, q, k, v, out, lse, None, None, None, 333, 290, hdim ** -0.5,
                                 poison=True)
    ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in (q, k, v)],
                    dout.float())
    lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), (q, k, v), dout)
    assert_close_grads(list(ours), ref, lowp)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [128, 256])
def test_deterministic_gradients_are_the_same_bits_every_time(causal, hdim):
    """deterministic=True: dQ from the dQ kernel, summed in one order; the atomics' dQ only close."""
    dtype = torch.bfloat16
    q, k, v = (randn(2, 700, 8, hdim, seed=s + hdim, dtype=dtype) for s in (20, 21, 22))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()  # GQA 4:1
    dout = randn(2, 700, 8, hdim, seed=23 + hdim, dtype=dtype)

    def run(deterministic):
        return gradients(lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=causal,
                                                                   deterministic=deterministic), (q, k, v), dout)
    first, second = run(True), run(True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    ref = gradients(lambda q, k, v: attention_reference(q, k, v, causal)[0], [t.float() for t in (q, k, v)],
                    dout.float())
    lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, causal), (q, k, v), dout)
    assert_close_grads(first, ref, lowp)
    assert_close_grads(run(False), ref, lowp)


@pytest.mark.parametrize("pass_name", ["bwd", "fwd+bwd"])
def test_bench_times_the_backward_beside_sdpa(pass_name):
    """`flashtune bench --pass`: flashtune's backward kernels in the row, dq's error against fp32,
    TFLOPS over 2.5 (3.5) forwards' FLOPs; SDPA's rows time SDPA's kernels and no layout copies (a
    model hands SDPA views whose layout its backward reads as it is)."""
    from flashtune.commands.bench import measure_shape
    from flashtune.measure.problem import Problem

    shape = Problem("bfloat16", 128, True, 1024, 1024, 2, 8, 8)
    rows = {r.backend: r for r in measure_shape(shape, ["flashtune", "sdpa-cudnn", "sdpa-flash", "flashtune-fp8"],
                                                3, pass_name=pass_name)}
    ours = rows["flashtune"]
    assert ours.status == "ok" and "flashtune_bwd_bf16_h128_" in ours.kernel, ours
    assert ours.rel_err < 2e-2 and ours.tflops > 0
    assert rows["flashtune-fp8"].status.startswith("unavailable: flashtune:")  # no FP8 backward
    for name in ("sdpa-cudnn", "sdpa-flash"):
        if rows[name].status == "ok":
            assert rows[name].rel_err < 2e-2, rows[name]
            assert "copy" not in rows[name].kernel, rows[name].kernel
