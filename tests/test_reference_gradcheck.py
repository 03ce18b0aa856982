"""The reference's gradients are the derivative: torch.autograd.gradcheck (finite differences in
float64) on tiny shapes. Every backward test and `flashtune verify`'s backward rows judge the kernels'
dQ, dK and dV against the reference's autograd, so its masked rows (no visible key: O = 0, LSE =
+inf, where logsumexp's and nan_to_num's derivatives meet -inf) and its GQA sums must be right
themselves. The kernels' own gradients against finite differences: tests/test_backward_gpu.py."""
from __future__ import annotations

import pytest
import torch

from flashtune.measure.reference import attention_reference, varlen_reference


def _inputs(*shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in shapes]


def _finite_lse(lse):
    """The LSE where a row sees a key (its +inf elsewhere has no derivative to check; its gradient is
    not used there: flash_attn's convention)."""
    return lse.masked_fill(torch.isinf(lse), 0.0)


@pytest.mark.parametrize("seqlen_q,seqlen_k,heads_q,heads_kv,causal", [
    (5, 7, 2, 2, False),
    (5, 7, 2, 2, True),
    (7, 4, 4, 2, True),   # GQA 2:1 and 3 rows that see no key (bottom-right alignment)
    (1, 6, 3, 1, True),   # one query token, MQA
    (6, 6, 2, 1, False),
])
def test_the_references_gradients_match_finite_differences(seqlen_q, seqlen_k, heads_q, heads_kv, causal):
    q, k, v = _inputs((2, seqlen_q, heads_q, 8), (2, seqlen_k, heads_kv, 8), (2, seqlen_k, heads_kv, 8),
                      seed=seqlen_q * 31 + seqlen_k)

    def attention(q, k, v):
        out, lse = attention_reference(q, k, v, causal)
        assert out.dtype == lse.dtype == torch.float64
        return out, _finite_lse(lse)

    assert torch.autograd.gradcheck(attention, (q, k, v))


def test_rows_that_see_no_key_get_zero_gradients_not_nan():
    q, k, v = _inputs((1, 5, 2, 8), (1, 2, 2, 8), (1, 2, 2, 8), seed=3)
    out, lse = attention_reference(q, k, v, causal=True)
    (out.sum() + _finite_lse(lse).sum()).backward()
    assert torch.isinf(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 3:]).all()
    assert torch.isfinite(q.grad).all() and torch.count_nonzero(q.grad[:, :3]) == 0
    assert torch.count_nonzero(q.grad[:, 3:]) > 0


def test_the_varlen_references_gradients_match_finite_differences():
    """Sequences of 3, 0 and 4 queries over 5, 2 and 0 keys: an empty query range, and one that sees no key."""
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 7], dtype=torch.int32)
    q, k, v = _inputs((7, 4, 8), (7, 2, 8), (7, 2, 8), seed=11)

    def attention(q, k, v):
        out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal=True)
        return out, _finite_lse(lse)

    assert torch.autograd.gradcheck(attention, (q, k, v))
