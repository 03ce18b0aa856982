import dataclasses

import pytest

from flashtune.kernels.arch import (ARCHS, KNOWN_GPUS, arch_for_compute_capability, default_family,
                            family_runs_on, get_arch, lookup_gpu)


@pytest.mark.parametrize("name, fp8, tma, wgmma", [
    ("sm_80", False, False, False),
    ("sm_86", False, False, False),
    ("sm_89", True, False, False),
    ("sm_90", True, True, False),
    ("sm_90a", True, True, True),
    ("sm_100a", True, True, False),
    ("sm_120", True, True, False),
])
def test_capabilities(name, fp8, tma, wgmma):
    arch = get_arch(name)
    assert (arch.fp8, arch.tma, arch.wgmma) == (fp8, tma, wgmma)
    assert arch.mma_sync


def test_only_sm90a_has_wgmma():
    assert [a.name for a in ARCHS.values() if a.wgmma] == ["sm_90a"]


def test_rtx5090_is_sm120_not_sm89():
    assert arch_for_compute_capability(12, 0).name == "sm_120"
    pattern, known = lookup_gpu("NVIDIA GeForce RTX 5090")
    assert pattern == "RTX 5090" and known.compute_capability == (12, 0)


def test_limits():
    assert get_arch("sm_80").max_smem_per_block == 166912
    assert get_arch("sm_89").max_smem_per_block == 101376
    assert get_arch("sm_120").max_smem_per_block == 101376
    assert get_arch("sm_90a").max_smem_per_block == 232448
    assert get_arch("sm_80").smem_per_sm == 167936
    assert get_arch("sm_86").smem_per_sm == 102400
    assert get_arch("sm_100a").smem_per_sm == 233472
    assert get_arch("sm_89").max_threads_per_sm == 1536
    assert get_arch("sm_90a").max_threads_per_sm == 2048
    assert get_arch("sm_120").min_nvcc == (12, 8)
    assert get_arch("sm_90a").torch_arch_list == "9.0a"
    assert get_arch("sm_90").torch_arch_list == "9.0"


@pytest.mark.parametrize("text", ["sm_89", "sm89", "89", "8.9", "SM_89", " sm_89 "])
def test_get_arch_spellings(text):
    assert get_arch(text).name == "sm_89"


@pytest.mark.parametrize("text, expected", [("sm_90a", "sm_90a"), ("9.0a", "sm_90a"), ("90", "sm_90"),
                                            ("12.0", "sm_120"), ("120", "sm_120"), ("sm_100", "sm_100a")])
def test_get_arch_more_spellings(text, expected):
    assert get_arch(text).name == expected


def test_get_arch_unknown_lists_known():
    with pytest.raises(ValueError, match="sm_77.*known archs: sm_80"):
        get_arch("sm_77")


@pytest.mark.parametrize("cc, name", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_89"),
                                      ((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((12, 0), "sm_120")])
def test_arch_for_compute_capability(cc, name):
    assert arch_for_compute_capability(*cc).name == name


def test_arch_for_unknown_compute_capability():
    with pytest.raises(ValueError, match="8.7 is not in flashtune's arch table"):
        arch_for_compute_capability(8, 7)


@pytest.mark.parametrize("gpu, pattern", [("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A10", "A10"),
                                          ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
                                          ("NVIDIA H200", "H200"),
                                          ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000")])
def test_lookup_gpu_longest_pattern(gpu, pattern):
    assert lookup_gpu(gpu)[0] == pattern
    stated = {"NVIDIA A100-SXM4-80GB": {"memory_gb": 80, "varies": None}}.get(gpu, {})  # the name says 80 GB
    assert lookup_gpu(gpu)[1] == dataclasses.replace(KNOWN_GPUS[pattern], **stated)


def test_lookup_gpu_versions_of_a_card():
    assert lookup_gpu("NVIDIA A100-SXM4-80GB")[1].memory_gb == 80  # the name states it
    assert lookup_gpu("NVIDIA A100-SXM4-80GB")[1].varies is None
    assert lookup_gpu("rtx4090") == lookup_gpu("NVIDIA GeForce RTX 4090")  # spaces and case do not count
    assert lookup_gpu("NVIDIA GeForce RTX 4090 D")[1].sm_count == 114
    for version in ("NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4080 SUPER"):
        facts = lookup_gpu(version)[1]  # not the card's own figures
        assert facts.sm_count is None and facts.memory_gb is None and "version of the RTX" in facts.varies
    assert lookup_gpu("NVIDIA GeForce RTX 3090 Ti")[1].compute_capability == (8, 6)
    assert lookup_gpu("NVIDIA RTX A4000") is None and lookup_gpu("RTX A1000 Laptop GPU") is None  # not A40, A100
    assert lookup_gpu("NVIDIA GH200 480GB")[1].memory_gb == 96  # 480 GB is the superchip's, not the GPU's
    assert lookup_gpu("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition")[1].sm_count == 188
    assert lookup_gpu("RTX 3080 12GB")[1].varies  # memory stated, SMs still unknown: the note stays
    assert lookup_gpu("NVIDIA H100 80GB HBM3")[1].sm_count == 132 and lookup_gpu("NVIDIA H100 PCIe")[1].sm_count == 114


def test_default_family():
    assert default_family(get_arch("sm_90a")) == "sm90"
    for name in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100a", "sm_120"):
        assert default_family(get_arch(name)) == "sm80"
    assert not family_runs_on("sm90", get_arch("sm_120"))
    assert family_runs_on("sm80", get_arch("sm_90a"))
