"""Write a profile YAML: a base profile with some (head dim, causal) tile tables replaced.

The output is meant to be read by people too: one flow-style line per config, adjacent
seqlen buckets with the same tile merged, and a provenance block saying where it came from.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import yaml

from flashtune.kernels.bwd_spec import BwdTile
from flashtune.kernels.decode_spec import DecodeSplitPolicy, DecodeTile
from flashtune.kernels.profiles import Profile
from flashtune.kernels.tiles import TileConfig, prefill_head_dims


def _config_line(family: str, hdim: int, causal: bool | None, lo: int, hi: int | None, tile: TileConfig,
                 indent: str = "  ") -> str:
    causal_text = "any" if causal is None else ("true" if causal else "false")
    hi_text = "null" if hi is None else str(hi)
    warps = (f"num_warpgroups: {tile.num_warpgroups}" if family == "sm90" else f"num_warps: {tile.num_warps}")
    keys = "".join(f", {name}: {'true' if value else 'false'}" for name, value in tile.schedule)  # sm90's own
    return (f"{indent}- {{hdim: {hdim}, causal: {causal_text}, seqlen: [{lo}, {hi_text}], block_m: {tile.block_m}, "
            f"block_n: {tile.block_n}, {warps}, stages: {tile.stages}{keys}}}")


def _table_lines(base: Profile, table, indent: str) -> list[str]:
    return [_config_line(base.family, e.hdim, e.causal, e.seqlen_min, e.seqlen_max, e.tile, indent) for e in table]


BucketTiles = dict[tuple[int, bool], list[tuple[int, int | None, TileConfig]]]  # (hdim, causal) -> (lo, hi, tile)


def tuned_configs(base: Profile, tiles: BucketTiles, table=None, indent: str = "  ", fp8: bool = False) -> list[str]:
    """Config lines per (hdim, causal): tuned ones get one tile per bucket [lo, hi) (adjacent equal
    tiles merged); the others keep the entries of `table` (default: the base's configs). `fp8`: the
    lines of fp8.configs, at the head dims with FP8 Q/K kernels."""
    table = base.configs if table is None else table
    lines = []
    for hdim in prefill_head_dims(base.head_dims, fp8):
        for causal in (False, True):
            if (hdim, causal) not in tiles:
                lines += [_config_line(base.family, hdim, causal, e.seqlen_min, e.seqlen_max, e.tile, indent)
                          for e in table if e.hdim == hdim and e.causal in (None, causal)]
                continue
            per_bucket = tiles[(hdim, causal)]
            lo = per_bucket[0][0]
            for i, (_, hi, tile) in enumerate(per_bucket):
                if i + 1 < len(per_bucket) and per_bucket[i + 1][2] == tile:
                    continue  # the next bucket has the same tile: widen this one
                lines.append(_config_line(base.family, hdim, causal, lo, hi, tile, indent))
                lo = hi
    return lines


def decode_lines(base: Profile, tuned: dict[tuple[int, int], DecodeTile] | None = None) -> list[str]:
    """The `decode:` section: the base's tiles with the tuned ones in their place, and the base's
    split policy where it is not the default; none at all when both are defaults."""
    tiles = {(hdim, rows): tile for hdim, rows, tile in base.decode_tiles}
    tiles.update(tuned or {})
    lines = []
    if tiles:
        lines.append("  tiles:")
        lines += [f"    - {{hdim: {hdim}, rows: {rows}, block_n: {t.block_n}, warps: {t.warps}, stages: {t.stages}}}"
                  for (hdim, rows), t in sorted(tiles.items())]
    if base.decode_split != DecodeSplitPolicy():  # the keys that differ from the defaults
        changed = {k: v for k, v in asdict(base.decode_split).items() if v != getattr(DecodeSplitPolicy(), k)}
        lines.append("  split: {" + ", ".join(f"{k}: {'null' if v is None else v}" for k, v in changed.items()) + "}")
    return ["decode:", *lines] if lines else []


def backward_lines(base: Profile, tuned: dict[int, BwdTile] | None = None) -> list[str]:
    """The `backward:` section: the base's tiles with the tuned ones in their place; none at all when
    there are none."""
    tiles = dict(base.backward_tiles)
    tiles.update(tuned or {})
    lines = []
    for hdim, t in sorted(tiles.items()):
        extra = "" if t.kernel == "wgmma" else f", warps: {t.warps}"
        lines.append(f"    - {{hdim: {hdim}, kernel: {t.kernel}{extra}}}")
    return ["backward:", "  tiles:", *lines] if lines else []


def write_profile(base: Profile, name: str, description: str, tiles: BucketTiles, provenance: dict,
                  path: str | Path, fp8: bool = False, fp8_pv: bool = False,
                  decode_tiles: dict[tuple[int, int], DecodeTile] | None = None,
                  backward_tiles: dict[int, BwdTile] | None = None) -> Path:
    """Write the tuned profile; the caller validates it by loading it back. `fp8`: the tiles
    are for the FP8 twins (fp8.configs), `fp8_pv` (with fp8) for the all-FP8 twins
    (fp8.pv_configs); the other tables are kept as they were. Each tuned
    (hdim, causal) must cover every sequence length: buckets from 0 up, each starting where the
    last ended, the last open. `decode_tiles`: tuned decode tiles per (hdim, rows), `backward_tiles`:
    tuned backward tiles per hdim; the base's decode and backward sections are kept either way."""
    for per_bucket in tiles.values():
        assert per_bucket[0][0] == 0 and per_bucket[-1][1] is None and all(
            prev[1] == nxt[0] for prev, nxt in zip(per_bucket, per_bucket[1:])), per_bucket
    header = {
        "name": name,
        "description": description,
        "match": {"names": list(base.match_names),
                  "compute_capability": ["{}.{}".format(*cc) for cc in base.match_compute_capabilities]},
        "family": base.family,
        "arch": base.arch.name,
        "dtypes": list(base.dtypes),
        "head_dims": list(base.head_dims),
        "nvcc_flags": list(base.nvcc_flags),
    }
    if not base.match_names and not base.match_compute_capabilities:
        header["match"] = {}
    text = "# Written by `flashtune tune`; see provenance at the end.\n"
    text += yaml.safe_dump(header, sort_keys=False, width=100)
    # The all-FP8 twins keep the tiles they had where a tune was not theirs, written as their own
    # table: the tiles they shared may move to ones P V's e4m3 panels refuse (block_n % 64).
    fp8_dims = prefill_head_dims(base.head_dims, fp8=True)
    pv_table = tuple(e for e in base.config_table(fp8_pv=True) if e.hdim in fp8_dims) if base.fp8_pv else ()
    pv_lines = _table_lines(base, pv_table, "    ")
    if fp8_pv:  # all-FP8 tiles tuned: they become fp8.pv_configs
        pv_lines = tuned_configs(base, tiles, pv_table, indent="    ", fp8=True)
        fp8_lines = _table_lines(base, base.fp8_configs, "    ")
        config_lines = _table_lines(base, base.configs, "  ")
    elif fp8:  # FP8 tiles tuned: they become fp8.configs (starting from the twins' current tiles)
        fp8_lines = tuned_configs(base, tiles, base.fp8_configs or base.configs, indent="    ", fp8=True)
        config_lines = _table_lines(base, base.configs, "  ")
    else:
        fp8_lines = _table_lines(base, base.fp8_configs, "    ")
        config_lines = tuned_configs(base, tiles)
    if base.fp8:
        text += yaml.safe_dump({"fp8": base.fp8}, sort_keys=False, width=100)
        if fp8_lines:
            text += "  configs:\n" + "\n".join(fp8_lines) + "\n"
        if pv_lines:
            text += "  pv_configs:\n" + "\n".join(pv_lines) + "\n"
    else:
        text += "fp8: null\n"
    text += "configs:\n" + "\n".join(config_lines) + "\n"
    for section in (decode_lines(base, decode_tiles), backward_lines(base, backward_tiles)):
        if section:
            text += "\n".join(section) + "\n"
    # A JSON round trip turns str subclasses (torch's TorchVersion) into plain YAML-safe values.
    text += yaml.safe_dump({"provenance": json.loads(json.dumps(provenance))}, sort_keys=False, width=100)
    path = Path(path)
    path.write_text(text)
    return path
