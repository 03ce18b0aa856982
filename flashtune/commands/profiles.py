"""`flashtune profiles` and `profiles show`: the shipped profiles and their derived numbers."""
from __future__ import annotations

from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flashtune.commands.common import human_bytes
from flashtune.kernels.bwd_spec import BWD_HEAD_DIMS, bwd_spec_for_profile
from flashtune.kernels.decode_spec import decode_row_groups, decode_smem_bytes, decode_tile_keys, e4m3_cache_tile
from flashtune.kernels.profiles import Profile
from flashtune.kernels.schedule import suffix_words
from flashtune.kernels.spec import spec_for
from flashtune.kernels.tiles import ctas_per_sm, shared_memory_bytes, threads_per_cta


def _match_text(profile: Profile) -> str:
    parts = list(profile.match_names)
    parts += ["cc {}.{}".format(*cc) for cc in profile.match_compute_capabilities]
    return ", ".join(parts) or "only with --profile"


def summary(profile: Profile) -> dict:
    return {
        "name": profile.name,
        "arch": profile.arch.name,
        "family": profile.family,
        "match": {"names": list(profile.match_names),
                  "compute_capability": ["{}.{}".format(*cc) for cc in profile.match_compute_capabilities]},
        "head_dims": list(profile.head_dims),
        "dtypes": list(profile.dtypes),
        "fp8": profile.fp8,
        "path": str(profile.path),
        "description": profile.description,
    }


def built_registers(profile: Profile, entry, fp8: bool = False, fp8_pv: bool = False) -> int | None:
    """Registers per thread that ptxas reported for this config, if any variant is in the
    build cache (the most of them); None until it is built."""
    import json

    from flashtune.kernels.build import MANIFEST, spec_dir
    from flashtune.kernels.spec import SpecError

    found = []
    for dtype in profile.dtypes:
        for causal in ((False, True) if entry.causal is None else (entry.causal,)):
            try:
                spec = spec_for(profile, entry.tile, dtype, entry.hdim, causal, fp8, fp8_pv=fp8_pv)
                manifest = json.loads((spec_dir(spec) / MANIFEST).read_text())
                found.append(manifest["result"]["registers"])
            except (SpecError, OSError, ValueError, KeyError):
                continue
    found = [r for r in found if r]
    return max(found) if found else None


def details(profile: Profile) -> dict:
    """The profile plus, per config, the numbers the resource model derives (for `configs`
    the 16-bit kernels', for `fp8.configs` the FP8 twins', for `fp8.pv_configs` the all-FP8 twins')."""
    return {**summary(profile), "nvcc_flags": list(profile.nvcc_flags),
            "configs": [_config_row(profile, e, False) for e in profile.configs],
            "fp8_configs": [_config_row(profile, e, True) for e in profile.fp8_configs],
            "fp8_pv_configs": [_config_row(profile, e, True, True) for e in profile.fp8_pv_configs],
            "decode": decode_details(profile), "backward": backward_details(profile)}


def backward_details(profile: Profile) -> list[dict]:
    """The backward kernel per head dim it takes, its kernel name (causal, bf16) and where it comes from."""
    own = {hdim for hdim, _ in profile.backward_tiles}
    rows = []
    for hdim in profile.head_dims:
        if hdim not in BWD_HEAD_DIMS:
            continue
        tile = profile.backward_tile(hdim)
        spec = bwd_spec_for_profile(profile, "bfloat16", hdim, True)
        rows.append({"hdim": hdim, "kernel": tile.kernel, "warps": tile.warps, "label": tile.label(),
                     "name": spec.name, "smem_bytes": spec.smem_bytes,
                     "source": "profile" if hdim in own else "default"})
    return rows


def decode_details(profile: Profile) -> dict:
    """The decode kernels' tile per (head dim, packed rows) and where it comes from, and the split
    policy."""
    own = {(hdim, rows) for hdim, rows, _ in profile.decode_tiles}
    tiles = []
    for hdim, rows in decode_tile_keys(profile.head_dims):
        tile = profile.decode_tile(hdim, rows)
        # an e4m3 cache's twin (the profile builds it): twice the stages; none for row groups
        e4m3 = profile.fp8_kv and decode_row_groups(hdim, rows) == 1
        tiles.append({"hdim": hdim, "rows": rows, "block_n": tile.block_n, "warps": tile.warps,
                      "stages": tile.stages, "smem_bytes": decode_smem_bytes(hdim, tile),
                      "e4m3_stages": e4m3_cache_tile(tile).stages if e4m3 else None,
                      "source": "profile" if (hdim, rows) in own else "default"})
    return {"tiles": tiles, "split": asdict(profile.decode_split)}


def _config_row(profile: Profile, entry, fp8: bool, fp8_pv: bool = False) -> dict:
    arch = profile.arch
    tile = entry.tile
    registers = built_registers(profile, entry, fp8, fp8_pv)
    causal_values = (False, True) if entry.causal is None else (entry.causal,)
    smem = shared_memory_bytes(profile.family, entry.hdim, tile, fp8, causal_values[0], fp8_pv)
    return {
        "hdim": entry.hdim,
        "causal": entry.causal_label,
        "seqlen": [entry.seqlen_min, entry.seqlen_max],
        "block_m": tile.block_m,
        "block_n": tile.block_n,
        "num_warps": tile.num_warps,
        "num_warpgroups": tile.num_warpgroups,
        "stages": tile.stages,
        # sm90: the schedule each causal value's kernel runs (the row's keys over the family's
        # defaults), and its kernel-name suffix ("" for the default schedule)
        "schedule": {("causal" if c else "non-causal"): _schedule(profile, entry, c, fp8, fp8_pv)
                     for c in causal_values}
        if profile.family == "sm90" else None,
        "threads": threads_per_cta(profile.family, tile),
        "smem_bytes": smem,
        "smem_limit_bytes": arch.max_smem_per_block,
        "smem_percent_of_limit": round(100 * smem / arch.max_smem_per_block, 1),
        "registers": registers,  # None until built (`flashtune build`)
        "ctas_per_sm": ctas_per_sm(profile.family, entry.hdim, tile, arch, fp8, registers=registers, fp8_pv=fp8_pv),
    }


def _schedule(profile: Profile, entry, causal: bool, fp8: bool, fp8_pv: bool = False) -> dict:
    spec = spec_for(profile, entry.tile, "bfloat16" if fp8_pv else profile.dtypes[0], entry.hdim, causal, fp8,
                    fp8_pv=fp8_pv)
    return {**asdict(spec.schedule), "name_suffix": spec.schedule_suffix}


def render_list(profiles: list[Profile], console: Console) -> None:
    table = Table(title="Profiles", title_justify="left", title_style="bold")
    for column in ("name", "arch", "family", "matches", "head dims", "fp8"):
        table.add_column(column, no_wrap=column in ("name", "arch", "family"))
    for p in profiles:
        fp8 = ", ".join(f"{k}: {v}" for k, v in p.fp8.items()) if p.fp8 else "no"
        table.add_row(p.name, p.arch.name, p.family, escape(_match_text(p)),
                      ", ".join(map(str, p.head_dims)), fp8)
    console.print(table)
    console.print("Details: flashtune profiles show NAME")


def fp8_recipes(profile: Profile) -> str:
    """The FP8 recipes a profile builds, in words."""
    recipes = []
    if profile.fp8_qk:
        recipes.append("Q and K in e4m3 (prefill twins: S = Q K^T on FP8 tensor cores, P V 16-bit)")
    if profile.fp8_pv:
        recipes.append("all-FP8 (prefill twins: Q, K, P and V in e4m3, both GEMMs on FP8 tensor cores, V transposed "
                       "by each call first; bf16 output)")
    if profile.fp8_kv:
        recipes.append("an e4m3 KV cache (decode twins: K and V read as e4m3 into MMA fragments, converted in "
                       "registers, f16 MMAs; twice the 16-bit tile's stages)")
    return "; ".join(recipes) if recipes else "none"


def render_details(profile: Profile, console: Console) -> None:
    data = details(profile)
    arch = profile.arch
    console.print(f"[bold]{escape(profile.name)}[/]  {escape(profile.description)}")
    console.print(f"file: {escape(str(profile.path))}")
    console.print(f"family {profile.family} on {arch.name}; matches: {escape(_match_text(profile))}")
    console.print(f"dtypes: {', '.join(profile.dtypes)}; FP8: {fp8_recipes(profile)}; "
                  f"nvcc flags: {' '.join(profile.nvcc_flags) or 'none'}")
    console.print(f"{arch.name} limits: {human_bytes(arch.max_smem_per_block)} shared memory per block, "
                  f"{human_bytes(arch.smem_per_sm)} per SM, {arch.max_threads_per_sm} threads per SM")
    tables = [("configs", profile.configs, data["configs"])]
    if profile.fp8_configs:
        tables.append(("fp8.configs (the FP8 twins' own tiles)", profile.fp8_configs, data["fp8_configs"]))
    if profile.fp8_pv_configs:
        tables.append(("fp8.pv_configs (the all-FP8 twins' own tiles)", profile.fp8_pv_configs,
                       data["fp8_pv_configs"]))
    for title, entries, rows in tables:
        table = Table(title=title if len(tables) > 1 else None, title_justify="left")
        warps_header = "warpgroups" if profile.family == "sm90" else "warps"
        for column in ("hdim", "causal", "seqlen", "tile", warps_header, "stages", "threads",
                       "smem", "% of limit", "registers", "CTAs/SM"):
            table.add_column(column, no_wrap=True)
        for entry, row in zip(entries, rows):
            warps = row["num_warpgroups"] if profile.family == "sm90" else row["num_warps"]
            suffixes = sorted({sched["name_suffix"] for sched in (row["schedule"] or {}).values()} - {""})
            shape = f"{row['block_m']}x{row['block_n']}" + "".join(f", {suffix_words(s)}" for s in suffixes)
            table.add_row(str(row["hdim"]), row["causal"], entry.seqlen_label, shape,
                          str(warps), str(row["stages"]), str(row["threads"]),
                          f"{row['smem_bytes']} B", f"{row['smem_percent_of_limit']}%",
                          str(row["registers"] or "-"), str(row["ctas_per_sm"]))
        console.print(table)
    decode = Table(title="decode kernels (queries of at most 16 rows, and the KV-cache functions)",
                   title_justify="left")
    e4m3 = profile.fp8_kv
    for column in ("hdim", "packed rows", "keys/step", "warps", "stages", *(("e4m3 cache stages",) if e4m3 else ()),
                   "smem", "from"):
        decode.add_column(column, no_wrap=True)
    for row in data["decode"]["tiles"]:
        e4m3_stages = (str(row["e4m3_stages"] or "-"),) if e4m3 else ()
        decode.add_row(str(row["hdim"]), str(row["rows"]), str(row["block_n"]), str(row["warps"]),
                       str(row["stages"]), *e4m3_stages, f"{row['smem_bytes']} B", row["source"])
    console.print(decode)
    backward = Table(title="backward kernels (inputs that require grad; deterministic=True: mma.sync)",
                     title_justify="left")
    for column in ("hdim", "kernel", "dq", "name (bf16, causal)", "smem", "from"):
        backward.add_column(column, no_wrap=True)
    for row in data["backward"]:
        backward.add_row(str(row["hdim"]), row["label"], "TMA reduce-add" if row["kernel"] == "wgmma" else "atomics",
                         row["name"], f"{row['smem_bytes']} B", row["source"])
    console.print(backward)
    split = data["decode"]["split"]
    memory = "the device's peak" if split["memory_gbps"] is None else f"{split['memory_gbps']:g} GB/s"
    console.print(f"decode splits: the count a cost model predicts fastest, at most {split['max_splits']} (a CTA "
                  f"streams its ring's bytes once per {split['ring_turnaround_us']:g} us; a combine "
                  f"{split['combine_us']:g} us + partials at {split['combine_gbps']:g} GB/s; up to "
                  f"{split['cluster_splits']} splits merge in a thread block cluster for {split['cluster_us']:g} us "
                  f"where the arch has clusters; memory: {memory}; a call read in at most "
                  f"{split['short_call_us']:g} us is short: up to 32 packed rows in two 16-row blocks)")
    if any(row["registers"] is None for row in data["configs"]):
        console.print("CTAs/SM counts shared memory and threads; registers (often the real limit) are known "
                      "once the kernels are built: `flashtune build --profile NAME`")
