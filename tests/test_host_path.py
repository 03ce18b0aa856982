"""The host side of a call on a decode step's path. Index values on the device are read on the host
(a sync) once per tensor version, not once per layer: checks.read_values remembers the tensors a
read found valid. transformers' decode steps skip flash_attn_func's checks and launch what it
launches. CPU tensors stand in for the GPU's (without a GPU every call reads, as it does on one
outside a captured graph), the launch recorded."""
import pytest
import torch

from flashtune.runtime import checks, kvcache
from flashtune.runtime.checks import FlashtuneInputError, ReadValues


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch):
    monkeypatch.setattr(checks, "read_values", ReadValues())


def counting(monkeypatch, method: str) -> list:
    calls = []
    original = getattr(torch.Tensor, method)

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(torch.Tensor, method, counted)
    return calls


def test_a_tensor_is_remembered_until_a_write_moves_its_version():
    memory = ReadValues()
    seqlens, table = torch.tensor([3, 5], dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32)
    memory.put((seqlens, None, table), (16, 64))
    assert memory.get((seqlens, None, table), (16, 64))
    assert memory.get((seqlens, None, table), (16, 128)) is None  # other sizes asked
    assert memory.get((seqlens, table, None), (16, 64)) is None
    table[1, 2] = 7  # a write to the tensor
    assert memory.get((seqlens, None, table), (16, 64)) is None
    memory.put((seqlens, None, table), (16, 64))
    seqlens[:1] += 1  # a write through a view
    assert memory.get((seqlens, None, table), (16, 64)) is None
    copy = seqlens.clone()  # the same values in another tensor: read again
    memory.put((seqlens,), ())
    assert memory.get((copy,), ()) is None


def test_a_freed_tensor_is_not_mistaken_for_a_new_one_at_its_address():
    memory = ReadValues()
    memory.put((torch.tensor([1], dtype=torch.int32),), ())  # freed at once
    assert all(memory.get((torch.tensor([1], dtype=torch.int32),), ()) is None for _ in range(20))


def test_inference_tensors_have_no_version_and_are_read_every_call():
    memory = ReadValues()
    with torch.inference_mode():
        seqlens = torch.tensor([3, 5], dtype=torch.int32)
    memory.put((seqlens,), ())
    assert memory.get((seqlens,), ()) is None


def test_the_memory_keeps_the_latest_entries():
    memory = ReadValues(size=2)
    tensors = [torch.zeros(1) for _ in range(3)]
    for t in tensors:
        memory.put((t,), ())
    assert memory.get((tensors[0],), ()) is None and memory.get((tensors[2],), ())


def test_cu_seqlens_are_read_once_per_version(monkeypatch):
    reads = counting(monkeypatch, "tolist")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    for _ in range(4):  # the layers of a forward
        checks.check_cu_seqlens(cu, "cu_seqlens_q", 7, 4, covers_all=True)
    assert len(reads) == 1
    checks.check_cu_seqlens(cu, "cu_seqlens_q", 9, 4, covers_all=False)  # another question: read
    assert len(reads) == 2
    cu[2] = 12  # past the 9 rows: the next call reads it and refuses
    with pytest.raises(FlashtuneInputError, match="must not exceed"):
        checks.check_cu_seqlens(cu, "cu_seqlens_q", 9, 12, covers_all=False)


def test_kv_cache_index_values_are_read_once_per_version(monkeypatch):
    reads = []
    read_flags = checks.read_flags
    monkeypatch.setattr(checks, "read_flags", lambda found: reads.append(sorted(found)) or read_flags(found))
    seqlens, table = torch.tensor([3, 20], dtype=torch.int32), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)

    def check(more=None):  # flash_attn_with_kvcache's: pages of 16, 4 of them, one new key a row
        kvcache._check_values(seqlens, None, None, table, 1, 32, 4, 4, 16, 0, more)

    for _ in range(4):
        check()
    assert len(reads) == 1
    check({"a descale must be 1": torch.zeros(1, dtype=torch.bool)})  # a call's own flags: read with them
    assert len(reads) == 2
    seqlens += 1  # the next step: read again
    check()
    assert len(reads) == 3
    table[1, 1] = 9  # a page the cache does not have: refused at the next call
    with pytest.raises(FlashtuneInputError, match="block_table's pages in use"):
        check()


def test_transformers_padding_mask_is_read_once_per_forward(monkeypatch):
    from flashtune import hf

    monkeypatch.setattr(hf, "_host_reads_allowed", lambda: True)
    reads = counting(monkeypatch, "__bool__")
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, :4] = False  # left padding
    runs = [hf._one_run(mask, mask[:, -8:], 1) for _ in range(4)]  # a static cache's layers
    assert len(reads) == 1 and all(r[0] is runs[0][0] and r[1] is runs[0][1] for r in runs)  # the same tensors
    first, end = runs[0]
    assert first.tolist() == [0, 2, 0] and end.tolist() == [8, 8, 8]
    mask[0, 5] = False  # a hole in row 0: not one run, so no decode kernel, read again
    assert hf._one_run(mask, mask[:, -8:], 1) is None and len(reads) == 2
    assert hf._one_run(mask, mask[:, -8:], 1) is None and len(reads) == 2
    monkeypatch.setattr(hf, "_host_reads_allowed", lambda: False)  # captured: no read, nothing remembered used
    assert hf._one_run(mask, mask[:, -8:], 1) is not None and len(reads) == 2


@pytest.mark.parametrize("heads, heads_kv, queries, keys, causal, extra", [
    (32, 8, 1, 4096, True, {}),
    (32, 1, 1, 70000, False, {}),  # MQA over a long cache: split, the short-call rows not taken
    (8, 8, 4, 777, True, dict(window_size=(255, 255), softcap=30.0)),
])
def test_transformers_decode_step_launches_what_flash_attn_func_launches(monkeypatch, heads, heads_kv, queries,
                                                                           keys, causal, extra):
    from flashtune.kernels.profiles import find_profile
    from flashtune.runtime import decode_splits, ops

    profile = find_profile("h100")
    launches = []
    for module in (ops, kvcache):
        monkeypatch.setattr(module, "active_profile", lambda device=None: profile)
        monkeypatch.setattr(module, "run_decode", lambda spec, *tensors, **kw: launches.append((spec, tensors, kw))
                            or (torch.empty(tensors[0].shape, dtype=tensors[0].dtype), None))
    monkeypatch.setattr(ops, "check_devices", lambda *a, **kw: None)
    monkeypatch.setattr(decode_splits, "device_facts", lambda index: (132, 3352.0))
    # transformers' layout: (batch, heads, seqlen, d) tensors, seen as flash_attn's through transposes
    q = torch.randn(2, heads, queries, 128, dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(2, heads_kv, keys, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    ops.flash_attn_func(q, k, v, softmax_scale=128 ** -0.5, causal=causal, **extra)  # transformers' scaling
    kvcache.padded_cache_decode(q, k, v, None, None, 128 ** -0.5, causal, **extra)
    (spec_a, tensors_a, kw_a), (spec_b, tensors_b, kw_b) = launches
    assert spec_a == spec_b and all(a is b for a, b in zip(tensors_a, tensors_b))
    assert kw_a.pop("variant_args") == kw_b.pop("variant_args")
    assert kw_b.pop("seqused_k") is None and kw_b.pop("leftpad_k") is None  # every key
    assert kw_a == kw_b, (kw_a, kw_b)
