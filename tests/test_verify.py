"""verify's pure parts: kernel-name classification, SASS parsing, the case matrix, the CLI without GPU."""
from __future__ import annotations

import dataclasses

from click.testing import CliRunner

from flashtune.commands import verify
from flashtune.cli import cli
from flashtune.kernels.profiles import find_profile

SASS = """
	code for sm_90
		Function : flashtune_fwd_sm80_bf16_h64_128x128_w4_s1_sm90
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA 0x200 ;
        /*0020*/                   LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR4][R2.64] ;
        /*0030*/                   LDSM.16.M88.4 R8, [R12] ;
        /*0040*/                   HMMA.16816.F32.BF16 R20, R8, R16, R20 ;
		Function : other_kernel
        /*0000*/                   STL [R1], R2 ;
"""


def test_parse_sass_reads_the_arch_and_mnemonics_of_one_kernel():
    parsed = verify.parse_sass(SASS, "flashtune_fwd_sm80_bf16_h64_128x128_w4_s1_sm90")
    assert parsed["found"] and parsed["arch"] == "sm_90"
    assert {m.split(".")[0] for m in parsed["mnemonics"]} == {"LDGSTS", "LDSM", "HMMA", "BRA", "LDC"}
    assert any(m.startswith("HMMA.16816") for m in parsed["mnemonics"])  # modifiers kept (FP8 checks read them)
    assert not any(m.startswith("STL") for m in parsed["mnemonics"])  # belongs to the other kernel
    assert not verify.parse_sass(SASS, "missing")["found"]


def test_unexpected_attention_kernels():
    ours = "flashtune_fwd_sm80_bf16_h128_128x64_w4_s1_sm90"
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert verify.unexpected_attention_kernels([ours, fill], ours) == []
    flash = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"
    assert verify.unexpected_attention_kernels([ours, flash], ours) == [flash]
    other_spec = "flashtune_fwd_sm80_bf16_h128_64x64_w4_s2_sm90"
    assert verify.unexpected_attention_kernels([other_spec], ours) == [other_spec]
    assert verify.unexpected_attention_kernels(["sm90_xmma_gemm_bf16bf16_bf16f32"], ours)


def test_a_decode_calls_combine_kernel_launches_exactly_when_its_splits_merge_through_it():
    split = "flashtune_decode_bf16_h128_m16x32_w4_s3_sm90a"
    combine = split + "_combine"
    assert verify.combine_problem([split, combine], combine, "combine kernel") is None
    assert "did not launch" in verify.combine_problem([split], combine, "combine kernel")
    assert verify.combine_problem([split], combine, "none") is None
    assert verify.combine_problem([split], combine, "cluster") is None
    assert "though the splits merged by cluster" in verify.combine_problem([split, combine], combine, "cluster")
    assert verify.combine_problem([split, combine], combine, None) is None  # not a decode call


def test_classify_sdpa():
    assert verify.classify_sdpa(["cudnn_generated_fort_native_sdpa_sm90_flash_fprop"]) == "cudnn"
    assert verify.classify_sdpa(["void pytorch_flash::flash_fwd_kernel<...>"]) == "flash"
    assert verify.classify_sdpa(["fmha_cutlassF_bf16_aligned_64x64_rf_sm80"]) == "efficient"
    assert verify.classify_sdpa(["ampere_bf16_s16816gemm", "softmax_warp_forward"]) == "math"


def test_case_matrix_covers_the_profile():
    profile = find_profile("h200-sm80")
    cases = verify.correctness_cases(profile)
    assert {c.dtype for c in cases} == set(profile.dtypes)
    assert {c.hdim for c in cases} == set(profile.head_dims)
    assert {c.causal for c in cases} == {False, True}
    assert any(c.varlen for c in cases) and any(c.heads_kv == 1 for c in cases)
    assert any(c.seqlen_q != c.seqlen_k for c in cases)


def test_verify_without_gpu_exits_3(monkeypatch):
    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: [])
    result = CliRunner().invoke(cli, ["verify"])
    assert result.exit_code == 3 and "no GPU is visible" in result.output


def test_the_matrix_has_decode_and_paged_kv_cache_rows():
    from flashtune.commands.verify import correctness_cases
    from flashtune.kernels.profiles import find_profile

    import torch

    from flashtune.kernels.cache_spec import CacheSpec
    from flashtune.kernels.decode_spec import DecodeSplitPolicy
    from flashtune.runtime.decode import decode_spec

    profile = find_profile("h200")
    cases = correctness_cases(profile)
    decode = [c for c in cases if c.name.startswith("decode ")]
    paged = [c for c in decode if c.page_size]
    # per dtype: 3 per head dim through flash_attn_func (GQA 1 and 4 tokens, MQA 4 tokens), 4 paged,
    # MQA one token short and long (two 16-row blocks, one of 32) and long at hdim 256 (two row groups)
    assert len(decode) == 2 * 3 * len(profile.head_dims) + 2 * 4 + 2 * 3 and len(profile.head_dims) == 4
    mqa_q1 = [c for c in decode if c.heads_kv == 1 and c.seqlen_q == 1]
    fast = dataclasses.replace(profile, decode_split=DecodeSplitPolicy(memory_gbps=4800))  # the H200's peak
    tiles = {(c.hdim, c.seqlen_k): decode_spec(fast, getattr(torch, c.dtype), c.hdim, False, 1, 32, None,
                                               key_rows=c.batch * c.seqlen_k).tile for c in mqa_q1}
    assert {k: t.rows for k, t in tiles.items()} == {(128, 5000): 16, (128, 65536): 32, (256, 65536): 32}
    assert tiles[256, 65536].warps == 8  # 2 row groups x 4 key groups
    assert sorted({c.page_size for c in paged}) == [1, 16, 64, 256]  # row gathers, whole-tile and whole-block pages
    assert all(c.seqlen_q <= 16 and c.heads // c.heads_kv in (4, 32) for c in decode)
    kv_cache = [c for c in decode if isinstance(decode_spec(profile, getattr(torch, c.dtype), c.hdim, c.causal,
                                                            c.seqlen_q, c.heads // c.heads_kv, c.page_size or None),
                                                CacheSpec)]
    assert len(kv_cache) == 2 * (3 + 1)  # every MQA 4-token row reaches the KV-cache kernels on sm90


def test_the_matrix_has_backward_rows_for_the_head_dims_the_backward_takes():
    from flashtune.commands.verify import FAMILY_SASS, correctness_cases
    from flashtune.kernels.bwd_spec import BWD_HEAD_DIMS
    from flashtune.kernels.profiles import find_profile

    profile = find_profile("h200")
    backward = [c for c in correctness_cases(profile) if c.backward]
    trainable = [h for h in profile.head_dims if h in BWD_HEAD_DIMS]
    assert len(backward) == len(profile.dtypes) * len(trainable) * 2
    assert {c.hdim for c in backward} == set(trainable) and {c.causal for c in backward} == {False, True}
    assert all(c.name.startswith("backward ") and c.heads != c.heads_kv and c.seqlen_q != c.seqlen_k
               for c in backward)
    assert FAMILY_SASS["backward"] == ("HMMA", "LDSM", "LDGSTS")


def test_the_matrix_has_all_fp8_rows_where_the_profile_builds_them():
    """h100 and h200 ask for all-FP8 twins (fp8.pv): one case each FP8 head dim and mask, and a GQA one,
    on inputs the op quantises; rtx4090 (FP8 Q/K only) and a100 (no FP8) have none."""
    for name in ("h100", "h200"):
        profile = find_profile(name)
        rows = [c for c in verify.correctness_cases(profile) if c.fp8_pv]
        assert all(c.fp8 and c.name.startswith("fp8all ") and c.dtype == "bfloat16" for c in rows)
        assert {(c.hdim, c.causal) for c in rows} == {(d, m) for d in (64, 128, 256) for m in (False, True)}
        assert any(c.heads_kv != c.heads for c in rows)
    for name in ("rtx4090", "a100"):
        assert not any(c.fp8_pv for c in verify.correctness_cases(find_profile(name)))


def test_an_all_fp8_calls_v_transpose_pass_is_its_own():
    """The V^T pass an all-FP8 call launches first is not another attention kernel; a decode call's
    companion is its combine kernel; a 16-bit prefill call has none."""
    from flashtune.runtime.selection import select_spec

    profile = find_profile("h100")
    spec = select_spec(profile, "bfloat16", 128, False, 1000, 1000, fp8=True, fp8_pv=True)
    transpose = "void flashtune::sm90::v_transpose_kernel<128>"
    names = [transpose, spec.name]
    assert verify.own_companions(spec, names) == (transpose,)
    assert verify.unexpected_attention_kernels(names, spec.name, verify.own_companions(spec, names)) == []
    plain = select_spec(profile, "bfloat16", 128, False, 1000, 1000)
    assert verify.own_companions(plain, names) == ()
    assert verify.unexpected_attention_kernels([transpose, plain.name], plain.name) == [transpose]


def test_an_all_fp8_kernels_sass_check_wants_qgmma_and_no_hgmma(monkeypatch):
    """An all-FP8 kernel runs both GEMMs on e4m3: its SASS has QGMMA and no HGMMA (cuobjdump of
    flashtune_fwd_sm90_bf16_h64_192x128_wg3_s2_fp8all_sm90a: 14 QGMMA, 0 HGMMA), and the check passes
    it; the same SASS under the 16-bit and Q/K-only twins' names fails for want of HGMMA."""
    import subprocess

    from flashtune.runtime.selection import select_spec

    profile = find_profile("h200")
    all_fp8 = select_spec(profile, "bfloat16", 64, False, 1000, 1000, fp8=True, fp8_pv=True)
    qk_only = select_spec(profile, "bfloat16", 64, False, 1000, 1000, fp8=True)
    plain = select_spec(profile, "bfloat16", 64, False, 1000, 1000)
    assert verify.wanted_sass(all_fp8) == ("UTMALDG", "QGMMA")
    assert verify.wanted_sass(qk_only) == ("HGMMA", "UTMALDG", "QGMMA")
    assert verify.wanted_sass(plain) == ("HGMMA", "UTMALDG")

    def sass_of(name):
        return (f"\tcode for sm_90a\n\t\tFunction : {name}\n"
                "        /*0000*/                   UTMALDG.2D [UR8], [UR4] ;\n"
                "        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;\n")

    for spec, ok in ((all_fp8, True), (qk_only, False), (plain, False)):
        monkeypatch.setattr(verify, "run_cuobjdump", lambda _tool, _args, n=spec.name: subprocess.CompletedProcess(
            [], 0, sass_of(n), ""))
        row = verify.sass_row(spec, "lib.so", spilled=False, cuobjdump="cuobjdump")
        assert row.ok is ok, row
        assert ok or row.detail == "missing HGMMA"


def test_verify_builds_every_kernel_its_cases_launch_side_by_side_before_the_first_case(monkeypatch):
    """A fresh machine's verify compiled each case's kernel as the case first ran, one at a time (three
    tries of 270-330 s under h200 finished none on an H100 machine); now every kernel the matrix launches,
    as the runtime chooses it, is built in one parallel batch first."""
    from types import SimpleNamespace

    import torch

    from flashtune.kernels.bwd_spec import BwdSpec
    from flashtune.kernels.decode_spec import DecodeSplitPolicy

    profile = dataclasses.replace(find_profile("h200"), decode_split=DecodeSplitPolicy(memory_gbps=4800))
    cases = verify.correctness_cases(profile)
    kernels = verify.verify_kernels(profile, 0)
    assert len(kernels) == len(set(kernels)) and len(kernels) < len(cases)  # cases share kernels
    assert {verify.case_spec(c, profile, 0) for c in cases} <= set(kernels)
    backward = [c for c in cases if c.backward]
    assert backward and all(isinstance(verify.case_spec(c, profile, 0), BwdSpec) for c in backward)
    assert all(verify.case_spec(dataclasses.replace(c, backward=False), profile, 0) in kernels for c in backward)

    events = []
    def build_specs(specs, jobs=None, force=False, on_done=None):
        events.append(("build", list(specs), jobs))
        for spec in specs:
            on_done(spec, None)
        return [], []

    monkeypatch.setattr("flashtune.kernels.build.build_specs", build_specs)
    monkeypatch.setattr(verify, "check_case", lambda case, profile, expected, seed:
                        events.append(("case", case.name)) or ([], verify.case_spec(case, profile, 0)))
    monkeypatch.setattr("flashtune.kernels.build.build_spec", lambda spec: SimpleNamespace(library="", spills=False))
    monkeypatch.setattr(verify, "sass_row", lambda spec, library, spilled, cuobjdump:
                        verify.Check("sass", spec.name, True, ""))
    monkeypatch.setattr("flashtune.kernels.toolchain.detect_toolchain", lambda: SimpleNamespace(cuobjdump_path=None))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    report = verify.run_verify(profile, jobs=3, on_built=lambda spec: events.append(("built", spec.name)))
    assert events[0] == ("build", kernels, 3)  # one batch, once: the CLI's bar counts its builds, then the cases
    assert events[1:len(kernels) + 1] == [("built", spec.name) for spec in kernels]
    assert [e[1] for e in events[len(kernels) + 1:]] == [c.name for c in cases]  # then the cases, in order
    assert {r.kernel for r in report.rows} == {verify.case_spec(c, profile, 0).name for c in cases}


def test_verify_jobs_is_not_an_option_of_verify_sdpa():
    result = CliRunner().invoke(cli, ["verify", "--sdpa", "--jobs", "2"])
    assert result.exit_code == 2 and "--jobs: not an option of verify --sdpa" in result.output
