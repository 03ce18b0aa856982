"""GPU facts without a GPU: detection through a fake torch, described targets and their errors."""
from types import SimpleNamespace

import pytest

from flashtune.kernels.gpu import describe_target, detect_gpus


def test_detect_with_provider(fake_props):
    (gpu,) = detect_gpus(lambda: [fake_props()], lambda: "580.65")
    assert gpu.index == 0 and gpu.name == "NVIDIA GeForce RTX 4090"
    assert gpu.arch.name == "sm_89" and gpu.compute_capability == (8, 9)
    assert gpu.sm_count == 128 and gpu.smem_per_block_optin == 101376
    assert gpu.driver == "580.65" and not gpu.is_target


def test_missing_attributes_are_none():
    props = SimpleNamespace(name="Old", major=8, minor=0)
    (gpu,) = detect_gpus(lambda: [props], lambda: None)
    assert gpu.sm_count is None and gpu.l2_bytes is None and gpu.memory_gbps is None and gpu.arch.name == "sm_80"


def test_peak_memory_bandwidth_from_the_memory_clock_and_bus(fake_props):
    # the RTX 4090 as torch reports it: 10,501 MHz x 384 bits, double data rate: 1,008 GB/s (its datasheet's)
    (gpu,) = detect_gpus(lambda: [fake_props(memory_clock_rate=10_501_000, memory_bus_width=384)], lambda: None)
    assert round(gpu.memory_gbps) == 1008


def test_unknown_compute_capability_has_no_arch(fake_props):
    (gpu,) = detect_gpus(lambda: [fake_props("Jetson AGX Orin", 8, 7)], lambda: None)
    assert gpu.arch is None


def test_no_gpu():
    assert detect_gpus(lambda: [], lambda: "unused") == []


def test_detect_through_monkeypatched_torch(monkeypatch, fake_props):
    import torch

    devices = [fake_props("NVIDIA H200", 9, 0), fake_props("NVIDIA H200", 9, 0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: devices[i])
    gpus = detect_gpus(driver_provider=lambda: "580.00")
    assert [g.index for g in gpus] == [0, 1]
    assert all(g.arch.name == "sm_90a" for g in gpus)


def test_describe_target_by_arch_and_gpu():
    target = describe_target(arch="sm_89")
    assert target.is_target and target.arch.name == "sm_89"
    assert target.smem_per_block_optin == 101376 and target.sm_count is None
    assert describe_target(gpu_name="RTX 5090").arch.name == "sm_120"
    assert describe_target(gpu_name="H200").arch.name == "sm_90a"
    assert describe_target(arch="sm_90", gpu_name="H200").arch.name == "sm_90"


def test_describe_target_errors():
    with pytest.raises(ValueError, match="unknown GPU 'GTX 9999'"):
        describe_target(gpu_name="GTX 9999")
    with pytest.raises(ValueError, match="is sm_89"):
        describe_target(arch="sm_120", gpu_name="RTX 4090")
    with pytest.raises(ValueError):
        describe_target()
