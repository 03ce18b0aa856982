"""flash_attn's packed calls without a GPU: a packed tensor of the wrong shape gets one clear error,
and each call hands the unpacked function views of its packed tensor (no copies) with every
argument it was given. Their numbers and gradients: tests/test_backward_gpu.py."""
from __future__ import annotations

import pytest
import torch

import flashtune
from flashtune.runtime import packed
from flashtune.runtime.ops import FlashtuneInputError


def test_a_packed_tensor_of_the_wrong_shape_says_which_shape():
    qkv, kv, q = torch.randn(2, 16, 3, 4, 64), torch.randn(2, 16, 2, 4, 64), torch.randn(2, 16, 4, 64)
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)
    cases = [
        (r"qkv must be \(batch, seqlen, 3, heads, head_dim\), got shape \(2, 16, 4, 64\)",
         flashtune.flash_attn_qkvpacked_func, (qkv[:, :, 0],)),
        (r"qkv must be \(batch, seqlen, 3, heads, head_dim\), got shape \(2, 16, 2, 4, 64\).*"
         r"flash_attn_func as q, k, v",
         flashtune.flash_attn_qkvpacked_func, (kv,)),
        (r"kv must be \(batch, seqlen, 2, heads, head_dim\), got shape \(2, 16, 3, 4, 64\)",
         flashtune.flash_attn_kvpacked_func, (q, qkv)),
        (r"qkv must be \(total, 3, heads, head_dim\), got shape \(2, 16, 3, 4, 64\); the varlen call's sequences",
         flashtune.flash_attn_varlen_qkvpacked_func, (qkv, cu, 16)),
        (r"kv must be \(total, 2, heads, head_dim\), got shape \(32, 3, 4, 64\).*flash_attn_varlen_func",
         flashtune.flash_attn_varlen_kvpacked_func, (q.flatten(0, 1), qkv.flatten(0, 1), cu, cu, 16, 16)),
        ("kv must be a torch.Tensor", flashtune.flash_attn_kvpacked_func, (q, [1, 2])),
    ]
    for match, fn, args in cases:
        with pytest.raises(FlashtuneInputError, match=match):
            fn(*args)


def test_the_unpacked_calls_checks_still_apply():
    with pytest.raises(FlashtuneInputError, match="dtype torch.float32; allowed"):
        flashtune.flash_attn_qkvpacked_func(torch.randn(2, 16, 3, 4, 64))
    kv = torch.randn(2, 16, 2, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(FlashtuneInputError, match=r"heads of q \(4\) must be a multiple of heads of k/v \(3\)"):
        flashtune.flash_attn_kvpacked_func(torch.randn(2, 16, 4, 64, dtype=torch.bfloat16), kv)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        return "out"


def _views_of(packed_tensor, tensors, axis):
    """Each tensor is packed_tensor's slice i along axis, in place (the same storage, no copy)."""
    for i, t in enumerate(tensors):
        assert t.untyped_storage().data_ptr() == packed_tensor.untyped_storage().data_ptr()
        assert t.data_ptr() == packed_tensor.select(axis, i).data_ptr()
        assert t.stride() == packed_tensor.select(axis, i).stride()
        assert torch.equal(t, packed_tensor.select(axis, i))


ARGS = dict(softmax_scale=0.3, causal=True, window_size=(5, 0), softcap=0.0, alibi_slopes=None, deterministic=True,
            return_attn_probs=False)


def test_the_fixed_length_calls_hand_flash_attn_func_views_and_every_argument(monkeypatch):
    func = Recorder()
    monkeypatch.setattr(packed, "flash_attn_func", func)
    qkv = torch.randn(2, 16, 3, 4, 64, dtype=torch.bfloat16)
    sinks = torch.zeros(4)
    assert flashtune.flash_attn_qkvpacked_func(qkv, 0.0, **ARGS, return_lse=True, sinks=sinks) == "out"
    (q, k, v, *rest), kw = func.calls[-1]
    _views_of(qkv, (q, k, v), 2)
    assert rest == [0.0, 0.3, True, (5, 0), 0.0, None, True, False]
    assert kw == dict(return_lse=True, sinks=sinks)

    q = torch.randn(2, 9, 8, 64, dtype=torch.bfloat16)
    kv = torch.randn(2, 16, 2, 2, 64, dtype=torch.bfloat16)
    flashtune.flash_attn_kvpacked_func(q, kv, **ARGS)
    (q_seen, k, v, *rest), kw = func.calls[-1]
    assert q_seen is q
    _views_of(kv, (k, v), 2)
    assert rest == [0.0, 0.3, True, (5, 0), 0.0, None, True, False]
    assert kw == dict(return_lse=False, sinks=None)


def test_the_varlen_calls_hand_flash_attn_varlen_func_views_and_every_argument(monkeypatch):
    func = Recorder()
    monkeypatch.setattr(packed, "flash_attn_varlen_func", func)
    qkv = torch.randn(40, 3, 4, 64, dtype=torch.float16)
    cu = torch.tensor([0, 25, 40], dtype=torch.int32)
    flashtune.flash_attn_varlen_qkvpacked_func(qkv, cu, 25, **ARGS)
    (q, k, v, cu_q, cu_k, max_q, max_k, *rest), kw = func.calls[-1]
    _views_of(qkv, (q, k, v), 1)
    assert cu_q is cu and cu_k is cu and max_q == max_k == 25
    assert rest == [0.0, 0.3, True, (5, 0), 0.0, None, True, False]

    q, kv = torch.randn(7, 4, 64, dtype=torch.float16), torch.randn(40, 2, 1, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    flashtune.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu, 4, 25, **ARGS, return_lse=True)
    (q_seen, k, v, *lengths_and_rest), kw = func.calls[-1]
    assert q_seen is q
    _views_of(kv, (k, v), 1)
    assert lengths_and_rest[:4] == [cu_q, cu, 4, 25]
    assert lengths_and_rest[4:] == [0.0, 0.3, True, (5, 0), 0.0, None, True, False]
    assert kw == dict(return_lse=True, sinks=None)

