"""torch.compile(fullgraph=True) over every trainable call, without a GPU: meta tensors run the
custom ops' fake implementations, so tracing the checks and the routing in front of the op (a host
read of cu_seqlens would break the graph) and the backward through autograd can be seen here. The
device check is lifted (it wants CUDA tensors); the numbers: tests/test_backward_gpu.py."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import EagerAndRecordGraphs

import flashtune
from flashtune.runtime import ops


def meta(*shape):
    return torch.randn(*shape, device="meta", dtype=torch.bfloat16, requires_grad=True)


CU = torch.tensor([0, 70, 128], dtype=torch.int32, device="meta")
CALLS = {
    "func": (lambda q, k, v: flashtune.flash_attn_func(q, k, v, causal=True), [(1, 128, 4, 64)] * 3),
    "varlen_func": (lambda q, k, v: flashtune.flash_attn_varlen_func(q, k, v, CU, CU, 70, 70, causal=True),
                    [(128, 4, 64)] * 3),
    "qkvpacked_func": (lambda t: flashtune.flash_attn_qkvpacked_func(t, causal=True), [(1, 128, 3, 4, 64)]),
    "kvpacked_func": (lambda q, kv: flashtune.flash_attn_kvpacked_func(q, kv, causal=True),
                      [(1, 128, 8, 64), (1, 128, 2, 2, 64)]),
    "varlen_qkvpacked_func": (lambda t: flashtune.flash_attn_varlen_qkvpacked_func(t, CU, 70, causal=True),
                              [(128, 3, 4, 64)]),
    "varlen_kvpacked_func": (lambda q, kv: flashtune.flash_attn_varlen_kvpacked_func(q, kv, CU, CU, 70, 70),
                             [(128, 8, 64), (128, 2, 2, 64)]),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_every_trainable_call_compiles_into_one_graph_with_its_backward(name, monkeypatch):
    monkeypatch.setattr(ops, "check_devices", lambda *tensors, **named: None)
    call, shapes = CALLS[name]
    inputs = [meta(*shape) for shape in shapes]
    recorder = EagerAndRecordGraphs()
    step = torch.compile(lambda *inputs: call(*inputs).float().square().sum(), fullgraph=True, backend=recorder)
    step(*inputs).backward()  # a graph break raises under fullgraph
    assert len(recorder.graphs) == 1
    ops_traced = [str(node.target) for node in recorder.graphs[0].graph.nodes if "flashtune" in str(node.target)]
    assert ops_traced == ["flashtune.attention_fwd.default"]
    assert [tuple(t.grad.shape) for t in inputs] == shapes


def test_a_static_caches_decode_step_compiles_into_one_graph():
    """transformers compiles a static cache's decode step, under no_grad as generate runs it: its
    attention (flashtune/hf.py, a padding mask over the whole buffer) is one node, the decode kernels'
    selection, build and loading outside the graph. (A step that needs gradients takes the varlen
    call, which has a backward: the decode kernels have none.)"""
    from flashtune import hf

    module = torch.nn.Module().eval()
    query, key, value = (t.detach() for t in (meta(3, 8, 1, 64), meta(3, 2, 512, 64), meta(3, 2, 512, 64)))
    mask = torch.ones(3, 512, dtype=torch.bool, device="meta")
    recorder = EagerAndRecordGraphs()
    step = torch.compile(lambda q, k, v, m: hf.attention_forward(module, q, k, v, m, scaling=0.125)[0],
                         fullgraph=True, backend=recorder)
    out = step(query, key, value, mask)
    assert out.shape == (3, 1, 8, 64) and len(recorder.graphs) == 1
    traced = [str(node.target) for node in recorder.graphs[0].graph.nodes if "flashtune" in str(node.target)]
    assert traced == ["flashtune.padded_cache_decode.default"]
