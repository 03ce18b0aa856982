"""The forward op's autograd formula without a GPU: meta tensors run the custom ops' fake
implementations, so what reaches the backward op can be seen here."""
from __future__ import annotations

import pytest
import torch

from flashtune.runtime import ops


@pytest.fixture
def backward_calls(monkeypatch):
    """The (dout, dlse) each backward call receives, as shapes (None: not given)."""
    calls, real = [], ops.attention_bwd

    def spy(dout, q, k, v, out, lse, dlse, *rest):
        calls.append((None if dout is None else tuple(dout.shape), None if dlse is None else tuple(dlse.shape)))
        return real(dout, q, k, v, out, lse, dlse, *rest)
    monkeypatch.setattr(ops, "attention_bwd", spy)
    return calls


def test_the_lse_gradient_reaches_the_backward_only_when_the_loss_uses_it(backward_calls):
    q, k, v = (torch.randn(1, 8, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def forward():
        return ops.attention_fwd(q, k, v, None, None, 8, 8, 0.125, False)
    out, _ = forward()
    out.float().sum().backward()  # no zeros filled in for the LSE's gradient (a launch and a read)
    out, lse = forward()
    lse.sum().backward()  # dO is then zeros of O's shape
    out, lse = forward()
    (out.float().sum() + lse.sum()).backward()
    assert backward_calls == [((1, 8, 2, 64), None), ((1, 8, 2, 64), (1, 2, 8)), ((1, 8, 2, 64), (1, 2, 8))]
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
