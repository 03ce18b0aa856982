"""Profiles: validated YAML files of tile configs, and choosing one for a GPU.

The format is documented in docs/profiles.md. Every error names the file, the key
and what is allowed: "<file>: <key path>: <what is wrong>; allowed: <...>".
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from flashtune.kernels.arch import KERNEL_FAMILIES, ArchFacts, family_runs_on, get_arch, known_arch_names
from flashtune.kernels.decode_spec import (CLUSTER_SPLITS, DecodeSplitPolicy, DecodeTile, decode_tile_problems,
                                           default_decode_tile)
from flashtune.kernels.bwd_spec import BwdTile, bwd_tile_problems, default_bwd_tile
from flashtune.kernels.gpu import GpuInfo
from flashtune.paths import profiles_dir, profiles_doc
from flashtune.kernels.spec import DTYPES as KERNEL_DTYPES, SpecError, specs_for_profile
from flashtune.kernels.schedule import FIELD_NAMES as SCHEDULE_KEYS, overrides_of
from flashtune.kernels.tiles import (BASE_HEAD_DIMS, FAMILY_HEAD_DIMS, FP8_HEAD_DIMS, TileConfig, check_tile,
                                     computed_head_dim, prefill_head_dims, sm90_tile)

DTYPES = tuple(KERNEL_DTYPES)  # what the kernels are written for (spec.py)
# qk: the prefill kernels' FP8 Q/K twins; pv (sm90, with qk): all-FP8 twins too, P V on FP8 tensor
# cores; kv: decode kernels for an e4m3 KV cache; k_smoothing: qk_fp8 quantisation subtracts K's mean
# over the tokens first (exact for softmax; cuts the error where keys have offset channels, as LLM
# keys do)
FP8_FORMATS = {"qk": ("e4m3",), "pv": ("e4m3",), "kv": ("e4m3",), "k_smoothing": (True, False)}


def how_to_write() -> str:
    return (f"copy a shipped profile (`flashtune profiles show NAME` prints its path), edit it as "
            f"{profiles_doc()} describes, and pass --profile PATH")

_TOP_KEYS = {"name": str, "description": str, "match": dict, "family": str, "arch": str,
             "dtypes": list, "head_dims": list, "fp8": (dict, type(None)),
             "nvcc_flags": list, "schedule": dict, "configs": list, "configs_from": str,
             "configs_replace": list, "provenance": dict, "decode": dict, "backward": dict}
_REQUIRED_TOP = ("name", "description", "match", "family", "arch", "dtypes", "head_dims")  # + configs or configs_from
_MATCH_KEYS = ("names", "compute_capability")
_DECODE_TILE_KEYS = ("hdim", "rows", "block_n", "warps", "stages")
_BACKWARD_TILE_KEYS = ("hdim", "kernel", "warps")
_CONFIG_KEYS = {"sm80": ("hdim", "causal", "seqlen", "block_m", "block_n", "num_warps", "stages"),
                "sm90": ("hdim", "causal", "seqlen", "block_m", "block_n", "num_warpgroups", "stages", *SCHEDULE_KEYS)}
_REQUIRED_CONFIG = {"sm80": ("hdim", "block_m", "block_n", "num_warps", "stages"),
                    "sm90": ("hdim", "block_m", "block_n", "stages")}


class ProfileError(ValueError):
    """A profile that cannot be loaded, validated or selected."""


@dataclass(frozen=True)
class ProfileConfig:
    """One row of the tile table: which calls it serves and the tile it uses."""
    hdim: int
    causal: bool | None  # None: both causal and not
    seqlen_min: int
    seqlen_max: int | None  # exclusive; None: unbounded
    tile: TileConfig

    def serves(self, hdim: int, causal: bool, seqlen: int) -> bool:
        return (self.hdim == hdim and self.causal in (None, causal)
                and self.seqlen_min <= seqlen
                and (self.seqlen_max is None or seqlen < self.seqlen_max))

    @property
    def seqlen_label(self) -> str:
        upper = "inf" if self.seqlen_max is None else str(self.seqlen_max)
        return f"[{self.seqlen_min}, {upper})"

    @property
    def causal_label(self) -> str:
        return "any" if self.causal is None else ("yes" if self.causal else "no")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    path: Path
    match_names: tuple[str, ...]
    match_compute_capabilities: tuple[tuple[int, int], ...]
    family: str
    arch: ArchFacts
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    fp8: dict | None = field(hash=False)  # e.g. {"qk": "e4m3"}
    nvcc_flags: tuple[str, ...]
    configs: tuple[ProfileConfig, ...]
    # `fp8: {qk: e4m3, configs: [...]}`: tiles for the FP8 twins (default: `configs`' tiles).
    fp8_configs: tuple[ProfileConfig, ...] = ()
    # `fp8: {pv: e4m3, pv_configs: [...]}`: tiles for the all-FP8 twins alone (default: the FP8
    # twins' tiles), so that the FP8 Q/K twins keep tiles whose block_n P V's e4m3 panels refuse.
    fp8_pv_configs: tuple[ProfileConfig, ...] = ()
    # Where the tiles came from (`flashtune tune` writes GPU, versions, date, measured TFLOPS).
    provenance: dict | None = field(default=None, hash=False, compare=False)
    # `decode: {tiles: [...], split: {...}}`: the decode kernels' tiles per (hdim, packed rows), over
    # the family's defaults for the arch, and the split policy.
    decode_tiles: tuple[tuple[int, int, DecodeTile], ...] = ()
    decode_split: DecodeSplitPolicy = DecodeSplitPolicy()
    # `backward: {tiles: [...]}`: the backward kernel per head dim, over the family's default.
    backward_tiles: tuple[tuple[int, BwdTile], ...] = ()

    def backward_tile(self, hdim: int) -> BwdTile:
        """The backward kernel for this head dim: the profile's, else the family's default for its
        arch (kernels/bwd_spec.py: the sm90 family's wgmma kernel, else mma.sync)."""
        for entry_hdim, tile in self.backward_tiles:
            if entry_hdim == hdim:
                return tile
        return default_bwd_tile(self.family, self.arch, hdim)

    def decode_tile(self, hdim: int, rows: int) -> DecodeTile:
        """The decode kernel's tile for this head dim and packed rows: the profile's, else the
        family's default for its arch (kernels/decode_spec.py)."""
        for entry_hdim, entry_rows, tile in self.decode_tiles:
            if (entry_hdim, entry_rows) == (hdim, rows):
                return tile
        return default_decode_tile(self.arch, hdim, rows)

    @property
    def fp8_qk(self) -> bool:
        return bool(self.fp8 and self.fp8.get("qk"))

    @property
    def fp8_pv(self) -> bool:
        """Whether the profile builds all-FP8 twins, P V on FP8 tensor cores too (`fp8: {qk: e4m3, pv: e4m3}`)."""
        return bool(self.fp8 and self.fp8.get("pv"))

    @property
    def k_smoothing(self) -> bool:
        """Whether qk_fp8 quantisation subtracts K's mean over the tokens first (`fp8: {k_smoothing: true}`)."""
        return bool(self.fp8 and self.fp8.get("k_smoothing"))

    @property
    def fp8_kv(self) -> bool:
        """Whether the profile builds decode kernels for an e4m3 KV cache (`fp8: {kv: e4m3}`)."""
        return bool(self.fp8 and self.fp8.get("kv"))

    def tile_for(self, hdim: int, causal: bool, seqlen_q: int, seqlen_k: int, fp8: bool = False,
                 fp8_pv: bool = False) -> TileConfig:
        """The tile for a call; the seqlen bucket is chosen by max(seqlen_q, seqlen_k). FP8 Q/K
        calls take `fp8.configs` where the profile has them, all-FP8 ones (`fp8_pv`)
        `fp8.pv_configs`, else the FP8 twins' tiles."""
        if hdim not in self.head_dims:
            raise ProfileError(f"{self.path}: head_dims: head dim {hdim} is not in profile "
                               f"{self.name}; allowed: {', '.join(map(str, self.head_dims))}")
        seqlen = max(seqlen_q, seqlen_k)
        for entry in self.config_table(fp8, fp8_pv):
            if entry.serves(hdim, bool(causal), seqlen):
                return entry.tile
        # Validation guarantees coverage, so this only happens for hand-built profiles.
        raise ProfileError(f"{self.path}: configs: no config for hdim {hdim}, causal={causal}, "
                           f"seqlen {seqlen}; allowed: buckets covering [0, inf)")

    def config_table(self, fp8: bool = False, fp8_pv: bool = False) -> tuple[ProfileConfig, ...]:
        """The config entries that serve the 16-bit kernels, the FP8 Q/K twins (`fp8`) or the
        all-FP8 twins (`fp8_pv`)."""
        if fp8_pv and self.fp8_pv_configs:
            return self.fp8_pv_configs
        return self.fp8_configs if (fp8 or fp8_pv) and self.fp8_configs else self.configs

    def match_reason(self, gpu: GpuInfo) -> str | None:
        """Why this profile matches `gpu` automatically ("name ..." / "compute capability ..."), or None."""
        pattern = self.matching_name(gpu.name)
        if pattern:
            return f"name {pattern!r} in {gpu.name!r}"
        if gpu.compute_capability in self.match_compute_capabilities:
            return "compute capability {}.{}".format(*gpu.compute_capability)
        return None

    def matching_name(self, gpu_name: str) -> str | None:
        hits = [p for p in self.match_names if p.lower() in gpu_name.lower()]
        return max(hits, key=len) if hits else None


# ---------------------------------------------------------------- loading and validation

class _Validator:
    """Turns parsed YAML into a Profile; every complaint names the file and key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, problem: str, allowed: str) -> ProfileError:
        return ProfileError(f"{self.path}: {key}: {problem}; allowed: {allowed}")

    def check_keys(self, data: dict, where: str, allowed: tuple[str, ...] | set[str],
                   required: tuple[str, ...] = ()) -> None:
        prefix = f"{where}." if where else ""
        for key in data:
            if key not in allowed:
                raise self.fail(f"{prefix}{key}", "unknown key", ", ".join(allowed))
        for key in required:
            if key not in data:
                raise self.fail(f"{prefix}{key}", "missing required key", ", ".join(allowed))

    def expect(self, value: Any, kind: type | tuple, key: str, allowed: str) -> Any:
        # bool is an int in Python; a block size of `true` is still wrong.
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok:
            raise self.fail(key, f"wrong type {type(value).__name__} ({value!r})", allowed)
        return value

    def str_list(self, value: Any, key: str, allowed: str) -> tuple[str, ...]:
        self.expect(value, list, key, allowed)
        return tuple(self.expect(v, str, f"{key}[{i}]", allowed) for i, v in enumerate(value))

    # -- sections

    def profile(self, data: Any) -> Profile:
        if not isinstance(data, dict):
            raise self.fail("(top level)", f"expected a mapping, got {type(data).__name__}",
                            "a YAML mapping with keys " + ", ".join(_TOP_KEYS))
        self.check_keys(data, "", tuple(_TOP_KEYS), _REQUIRED_TOP)
        for key, kind in _TOP_KEYS.items():
            if key in data:
                self.expect(data[key], kind, key, _type_name(kind))

        name = data["name"]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise self.fail("name", f"{name!r} is not a simple name", "letters, digits, '.', '_', '-'")
        family = data["family"]
        if family not in KERNEL_FAMILIES:
            raise self.fail("family", f"unknown family {family!r}", ", ".join(KERNEL_FAMILIES))
        try:
            arch = get_arch(data["arch"])
        except ValueError:
            raise self.fail("arch", f"unknown arch {data['arch']!r}", ", ".join(known_arch_names())) from None
        if not family_runs_on(family, arch):
            raise self.fail("family", f"family {family} needs {KERNEL_FAMILIES[family].needs}, "
                            f"which {arch.name} lacks", "sm80 on any arch; sm90 only with arch sm_90a")

        dtypes = self.str_list(data["dtypes"], "dtypes", ", ".join(DTYPES))
        for i, dtype in enumerate(dtypes):
            if dtype not in DTYPES:
                raise self.fail(f"dtypes[{i}]", f"unknown dtype {dtype!r}", ", ".join(DTYPES))
        if not dtypes:
            raise self.fail("dtypes", "empty list", ", ".join(DTYPES))

        head_dims = self.head_dims(data["head_dims"], family)
        fp8 = self.fp8(data.get("fp8"), arch, family)
        match_names, match_ccs = self.match(data["match"])
        nvcc_flags = self.nvcc_flags(data.get("nvcc_flags", []))
        schedule = self.schedule(data.get("schedule", {}), "schedule", family)
        # `configs` serve the 16-bit kernels (and the FP8 twins unless fp8.configs exist), so
        # they are checked against the 16-bit resource model; fp8.configs against the FP8 one.
        configs = self.configs(self.tile_table(data, family), family, arch, head_dims, False, schedule)
        fp8_configs = ()
        if fp8 is not None and "configs" in data["fp8"]:
            fp8_configs = self.configs(data["fp8"]["configs"], family, arch, head_dims, True, schedule,
                                       "fp8.configs")
        fp8_pv_configs = ()
        if fp8 is not None and "pv_configs" in data["fp8"]:
            fp8_pv_configs = self.configs(data["fp8"]["pv_configs"], family, arch, head_dims, True, schedule,
                                          "fp8.pv_configs", fp8_pv=True)  # the all-FP8 resource model
        if fp8 and fp8.get("pv"):  # the all-FP8 twins' tiles: their own, else the FP8 twins'
            key = "fp8.pv_configs" if fp8_pv_configs else "fp8.configs" if fp8_configs else "configs"
            self.check_fp8_pv_tiles(fp8_pv_configs or fp8_configs or configs, arch, key)
        return Profile(name=name, description=data["description"], path=self.path,
                       match_names=match_names, match_compute_capabilities=match_ccs,
                       family=family, arch=arch, dtypes=dtypes, head_dims=head_dims, fp8=fp8,
                       nvcc_flags=nvcc_flags, configs=configs, fp8_configs=fp8_configs,
                       fp8_pv_configs=fp8_pv_configs,
                       provenance=data.get("provenance"), **self.decode(data.get("decode"), arch, head_dims),
                       backward_tiles=self.backward(data.get("backward"), arch, head_dims))

    def decode(self, value: dict | None, arch: ArchFacts, head_dims: tuple[int, ...]) -> dict:
        """The `decode:` section: tiles per (hdim, rows) and the split policy, each checked against the
        decode kernels' rules for this arch."""
        if not value:
            return {}
        self.check_keys(value, "decode", ("tiles", "split"))
        tiles, seen = [], set()
        entries = self.expect(value.get("tiles", []), list, "decode.tiles", "a list of decode tiles")
        for i, entry in enumerate(entries):
            key = f"decode.tiles[{i}]"
            self.expect(entry, dict, key, "{hdim, rows, block_n, warps, stages}")
            self.check_keys(entry, key, _DECODE_TILE_KEYS, _DECODE_TILE_KEYS)
            for name in _DECODE_TILE_KEYS:
                self.expect(entry[name], int, f"{key}.{name}", "an integer")
            if entry["hdim"] not in head_dims:
                raise self.fail(f"{key}.hdim", f"head dim {entry['hdim']} is not in head_dims",
                                ", ".join(map(str, head_dims)))
            if entry["hdim"] not in BASE_HEAD_DIMS:  # the decode kernels compute 192 at 256, with 256's tile
                raise self.fail(f"{key}.hdim", f"the decode kernels compute head dim {entry['hdim']} at "
                                f"{computed_head_dim(entry['hdim'])}: give the tile there",
                                ", ".join(str(d) for d in head_dims if d in BASE_HEAD_DIMS))
            tile = DecodeTile(entry["rows"], entry["block_n"], entry["warps"], entry["stages"])
            problems = decode_tile_problems(entry["hdim"], tile, arch)
            if problems:
                raise self.fail(key, "; ".join(problems), "a tile the decode kernels take on " + arch.name)
            if (entry["hdim"], entry["rows"]) in seen:
                raise self.fail(key, f"a second tile for hdim {entry['hdim']}, rows {entry['rows']}",
                                "one tile per (hdim, rows)")
            seen.add((entry["hdim"], entry["rows"]))
            tiles.append((entry["hdim"], entry["rows"], tile))
        keys = tuple(f.name for f in fields(DecodeSplitPolicy))
        split = self.expect(value.get("split", {}), dict, "decode.split", "{" + ", ".join(keys) + "}")
        self.check_keys(split, "decode.split", keys, ())
        counts = {"max_splits": (1, 256), "cluster_splits": (0, CLUSTER_SPLITS)}  # integers in a range
        for key, number in split.items():
            if key in counts:
                low, high = counts[key]
                if not (isinstance(number, int) and not isinstance(number, bool) and low <= number <= high):
                    raise self.fail(f"decode.split.{key}", f"{number!r}", f"an integer in {low}..{high}")
                continue
            floor = 0 if key == "short_call_us" else None  # 0: no call is short
            number_ok = isinstance(number, (int, float)) and not isinstance(number, bool) and (
                number > 0 or number == floor)
            if not (number_ok or (key == "memory_gbps" and number is None)):
                raise self.fail(f"decode.split.{key}", f"{number!r}",
                                "0 or a positive number" if floor == 0 else "a positive number")
        policy = DecodeSplitPolicy(**split)
        return {"decode_tiles": tuple(tiles), "decode_split": policy}

    def backward(self, value: dict | None, arch: ArchFacts, head_dims: tuple[int, ...]) -> tuple:
        """The `backward:` section: a tile per head dim, each checked against the backward kernels'
        rules for this arch."""
        if not value:
            return ()
        self.check_keys(value, "backward", ("tiles",))
        tiles, seen = [], set()
        entries = self.expect(value.get("tiles", []), list, "backward.tiles", "a list of backward tiles")
        for i, entry in enumerate(entries):
            key = f"backward.tiles[{i}]"
            self.expect(entry, dict, key, "{hdim, kernel: wgmma} or {hdim, kernel: mma_sync, warps}")
            self.check_keys(entry, key, _BACKWARD_TILE_KEYS, ("hdim", "kernel"))
            self.expect(entry["hdim"], int, f"{key}.hdim", "an integer")
            if entry["hdim"] not in head_dims:
                raise self.fail(f"{key}.hdim", f"head dim {entry['hdim']} is not in head_dims",
                                ", ".join(map(str, head_dims)))
            kernel = entry["kernel"]
            if kernel == "wgmma":
                if "warps" in entry:
                    raise self.fail(f"{key}.warps", "the wgmma kernel has two consumer warpgroups", "no warps key")
                tile = BwdTile("wgmma", 8)
            elif kernel == "mma_sync":  # without warps: the mma.sync default for the arch (the most that fit)
                tile = (BwdTile("mma_sync", entry["warps"]) if "warps" in entry
                        else default_bwd_tile("sm80", arch, entry["hdim"]))
            else:
                raise self.fail(f"{key}.kernel", f"{kernel!r}", "wgmma or mma_sync")
            problems = bwd_tile_problems(entry["hdim"], tile, arch)
            if problems:
                raise self.fail(key, "; ".join(problems), "a tile the backward kernels take on " + arch.name)
            if entry["hdim"] in seen:
                raise self.fail(key, f"a second tile for hdim {entry['hdim']}", "one tile per head dim")
            seen.add(entry["hdim"])
            tiles.append((entry["hdim"], tile))
        return tuple(tiles)

    def nvcc_flags(self, value: Any) -> tuple[str, ...]:
        flags = self.str_list(value, "nvcc_flags", "a list of strings")
        for i, flag in enumerate(flags):  # the schedule was once chosen by -D switches
            if flag.startswith("-DFLASHTUNE_SM90_"):
                raise self.fail(f"nvcc_flags[{i}]", f"{flag} chooses nothing any more: the sm90 schedule is data",
                                "schedule keys (" + ", ".join(SCHEDULE_KEYS) + ") per config or in `schedule:` "
                                f"for every config ({profiles_doc()}); the experiments behind other "
                                "FLASHTUNE_SM90_* flags were removed (docs/experiments.md)")
        return flags

    def schedule(self, value: Any, key: str, family: str) -> dict[str, bool]:
        """Schedule keys (flashtune/kernels/schedule.py): the profile's `schedule:` mapping, for every config, or
        a config's own, which win over it. sm90 only."""
        if not value:
            return {}
        if family != "sm90":
            raise self.fail(key, "a schedule is the sm90 family's", "omit it for sm80")
        self.check_keys(value, key, SCHEDULE_KEYS, ())
        return {name: self.expect(flag, bool, f"{key}.{name}", "true or false") for name, flag in value.items()}

    def tile_table(self, data: dict, family: str) -> list:
        """The raw `configs` list: this file's, or, with `configs_from: NAME`, the shipped
        profile NAME's (an experiment that changes only nvcc_flags then A/Bs the same tiles
        after every re-tune), with `configs_replace` in place of NAME's entries for the (hdim,
        causal) pairs it names (an experiment on one bucket keeps the rest of NAME's table as NAME
        changes). Checked afterwards against this profile's family, arch and flags."""
        allowed = "a tile table (configs), or configs_from: the name of a shipped profile"
        if "configs" not in data and "configs_from" not in data:
            raise self.fail("configs", "missing required key", allowed)
        if "configs" in data and "configs_from" in data:
            raise self.fail("configs", "give configs or configs_from, not both", allowed)
        if "configs_replace" in data and "configs_from" not in data:
            raise self.fail("configs_replace", "only with configs_from", "configs_from: NAME beside it")
        if "configs" in data:
            return data["configs"]
        name = data["configs_from"]
        shipped = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
        base_path = profiles_dir() / f"{name}.yaml"
        if name not in shipped:  # read as plain YAML, not loaded: no chain of configs_from to follow
            raise self.fail("configs_from", f"no shipped profile {name!r}", ", ".join(shipped))
        base = yaml.safe_load(base_path.read_text())
        if not isinstance(base, dict) or not isinstance(base.get("configs"), list):
            raise self.fail("configs_from", f"{base_path} has no configs list of its own",
                            "a shipped profile with a configs list")
        if base.get("family") != family:
            raise self.fail("configs_from", f"{name} is a {base.get('family')} profile, this one {family}",
                            f"a shipped {family} profile")
        return self.replaced(base["configs"], data.get("configs_replace", []), name)

    def replaced(self, base: list, replacements: list, base_name: str) -> list:
        """`base` with its entries for each (hdim, causal) that `replacements` names swapped for
        the replacements (where the first of them stood)."""
        pairs = set()
        for i, entry in enumerate(replacements):
            where = f"configs_replace[{i}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("hdim"), int) or \
                    not isinstance(entry.get("causal"), bool):
                raise self.fail(where, "needs an int hdim and causal true or false",
                                "a config entry, as in configs, for one (hdim, causal)")
            pairs.add((entry["hdim"], entry["causal"]))
        table, placed = [], False
        for entry in base:
            hdim, causal = entry.get("hdim"), entry.get("causal")
            if causal == "any" and {(hdim, False), (hdim, True)} & pairs:
                raise self.fail("configs_replace", f"{base_name}'s hdim {hdim} entries are for causal: any",
                                "replace only (hdim, causal) pairs that the base lists per causal value")
            if (hdim, causal) in pairs:
                if not placed:
                    table += replacements
                    placed = True
                continue
            table.append(entry)
        return table if placed else table + replacements

    def head_dims(self, value: list, family: str) -> tuple[int, ...]:
        built = FAMILY_HEAD_DIMS[family]
        allowed = ", ".join(map(str, built))
        dims = tuple(self.expect(v, int, f"head_dims[{i}]", allowed) for i, v in enumerate(value))
        for i, dim in enumerate(dims):
            if dim not in built:
                raise self.fail(f"head_dims[{i}]", f"head dim {dim} is not built by family {family}", allowed)
        if not dims or len(set(dims)) != len(dims):
            raise self.fail("head_dims", "empty or repeated entries", f"distinct values from {allowed}")
        return dims

    def check_fp8_pv_tiles(self, entries: tuple[ProfileConfig, ...], arch: ArchFacts, key: str) -> None:
        for i, entry in enumerate(entries):
            if entry.hdim not in FP8_HEAD_DIMS:
                continue
            for is_causal in ((False, True) if entry.causal is None else (entry.causal,)):
                problems = check_tile("sm90", entry.hdim, entry.tile, arch, True, is_causal, fp8_pv=True)
                if problems:
                    p = problems[0]
                    raise self.fail(f"{key}[{i}].{p.key}", f"(hdim {entry.hdim}, fp8.pv) {p.problem}",
                                    p.allowed + " (or fp8.pv_configs of their own for the all-FP8 kernels)")

    def fp8(self, value: dict | None, arch: ArchFacts, family: str) -> dict | None:
        if value is None:
            return None
        self.expect(value, dict, "fp8", "null or a mapping like {qk: e4m3, kv: e4m3}")
        self.check_keys(value, "fp8", (*FP8_FORMATS, "configs", "pv_configs"))
        for key, formats in FP8_FORMATS.items():
            if key in value and value[key] not in formats:
                raise self.fail(f"fp8.{key}", f"unknown value {value[key]!r}", ", ".join(map(str, formats)).lower())
        if not arch.fp8:
            raise self.fail("fp8", f"{arch.name} has no FP8 tensor cores",
                            "fp8: null on sm_80/sm_86; FP8 on sm_89, sm_90a, sm_100a, sm_120")
        if value.get("pv") and (family != "sm90" or not value.get("qk")):
            raise self.fail("fp8.pv", "FP8 P V is the sm90 family's all-FP8 kernel, beside its FP8 Q/K one",
                            "fp8: {qk: e4m3, pv: e4m3} on an sm90 profile; omit pv elsewhere")
        if "configs" in value and not value.get("qk"):
            raise self.fail("fp8.configs", "tiles for FP8 kernels the profile does not ask for",
                            "fp8: {qk: e4m3, configs: [...]}")
        if "pv_configs" in value and not value.get("pv"):
            raise self.fail("fp8.pv_configs", "tiles for all-FP8 kernels the profile does not ask for",
                            "fp8: {qk: e4m3, pv: e4m3, pv_configs: [...]}")
        return {k: v for k, v in value.items() if k not in ("configs", "pv_configs")} or None

    def match(self, value: dict) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
        self.check_keys(value, "match", _MATCH_KEYS)
        names = self.str_list(value.get("names", []), "match.names", "a list of GPU name patterns")
        raw_ccs = value.get("compute_capability", [])
        self.expect(raw_ccs, list, "match.compute_capability", 'a list like ["8.9"]')
        ccs = []
        for i, cc in enumerate(raw_ccs):
            m = re.fullmatch(r"(\d+)\.(\d+)", str(cc)) if isinstance(cc, (str, float)) else None
            if not m:
                raise self.fail(f"match.compute_capability[{i}]", f"{cc!r} is not MAJOR.MINOR",
                                'strings like "8.9" or "12.0"')
            ccs.append((int(m.group(1)), int(m.group(2))))
        return names, tuple(ccs)

    def configs(self, value: list, family: str, arch: ArchFacts, head_dims: tuple[int, ...],
                fp8: bool, schedule: dict[str, bool], key: str = "configs",
                fp8_pv: bool = False) -> tuple[ProfileConfig, ...]:
        self.expect(value, list, key, "a list of configs")
        if not value:
            raise self.fail(key, "empty list", "one entry per (hdim, causal, seqlen bucket)")
        entries = tuple(self.config(entry, f"{key}[{i}]", family, arch, head_dims, fp8, schedule, fp8_pv)
                        for i, entry in enumerate(value))
        self.check_buckets(entries, prefill_head_dims(head_dims, fp8), key)
        return entries

    def config(self, entry: Any, key: str, family: str, arch: ArchFacts,
               head_dims: tuple[int, ...], fp8: bool, schedule: dict[str, bool],
               fp8_pv: bool = False) -> ProfileConfig:
        self.expect(entry, dict, key, "a mapping with keys " + ", ".join(_CONFIG_KEYS[family]))
        self.check_keys(entry, key, _CONFIG_KEYS[family], _REQUIRED_CONFIG[family])
        ints = {}
        for field_name in ("hdim", "block_m", "block_n", "num_warps", "num_warpgroups", "stages"):
            if field_name in entry:
                ints[field_name] = self.expect(entry[field_name], int, f"{key}.{field_name}", "an integer")
        hdim = ints["hdim"]
        if hdim not in head_dims:
            raise self.fail(f"{key}.hdim", f"{hdim} is not in head_dims",
                            ", ".join(map(str, head_dims)))
        causal = self.causal(entry.get("causal", "any"), f"{key}.causal")
        seqlen_min, seqlen_max = self.seqlen(entry.get("seqlen", [0, None]), f"{key}.seqlen")

        if family == "sm90":
            own = {name: self.expect(entry[name], bool, f"{key}.{name}", "true or false")
                   for name in SCHEDULE_KEYS if name in entry}
            keys = overrides_of({**schedule, **own})
            tile = sm90_tile(ints["block_m"], ints["block_n"], ints["stages"], keys)
            if "num_warpgroups" in ints:  # optional, but when given it must agree
                tile = TileConfig(tile.block_m, tile.block_n, tile.num_warps, tile.stages,
                                  ints["num_warpgroups"], keys)
        else:
            tile = TileConfig(ints["block_m"], ints["block_n"], ints["num_warps"], ints["stages"])
        for is_causal in ((False, True) if causal is None else (causal,)):
            problems = [p for p in check_tile(family, hdim, tile, arch, fp8, is_causal, fp8_pv)
                        if p.key not in ("family", "fp8")]
            if problems:  # family/arch and fp8/arch were already checked at the top level
                p = problems[0]
                raise self.fail(f"{key}.{p.key}", f"(hdim {hdim}) {p.problem}", p.allowed)
        return ProfileConfig(hdim, causal, seqlen_min, seqlen_max, tile)

    def causal(self, value: Any, key: str) -> bool | None:
        if value == "any":
            return None
        if isinstance(value, bool):
            return value
        raise self.fail(key, f"{value!r}", "true, false or any")

    def seqlen(self, value: Any, key: str) -> tuple[int, int | None]:
        allowed = "[min, max] with 0 <= min < max, max null for no upper bound (max is exclusive)"
        if not (isinstance(value, list) and len(value) == 2):
            raise self.fail(key, f"{value!r} is not a [min, max] pair", allowed)
        low, high = value
        if isinstance(low, bool) or not isinstance(low, int) or low < 0:
            raise self.fail(key, f"min {low!r} is not a non-negative integer", allowed)
        if high is not None and (isinstance(high, bool) or not isinstance(high, int) or high <= low):
            raise self.fail(key, f"max {high!r} is not an integer above min", allowed)
        return low, high

    def check_buckets(self, entries: tuple[ProfileConfig, ...], head_dims: tuple[int, ...],
                      key: str = "configs") -> None:
        """For each head dim and causal value the buckets must cover [0, inf) exactly once."""
        allowed = "for each head dim and causal value, seqlen buckets covering [0, null) exactly once"
        for hdim in head_dims:
            for causal in (False, True):
                rows = sorted((e.seqlen_min, i, e) for i, e in enumerate(entries)
                              if e.hdim == hdim and e.causal in (None, causal))
                what = f"hdim {hdim} causal={str(causal).lower()}"
                if not rows:
                    raise self.fail(key, f"{what}: no config", allowed)
                covered_to, prev_index = 0, None
                for low, index, entry in rows:
                    if prev_index is not None and covered_to is None:
                        raise self.fail(f"{key}[{index}].seqlen", f"{what}: overlaps {key}[{prev_index}] "
                                        "(which has no upper bound)", allowed)
                    if low < covered_to:
                        raise self.fail(f"{key}[{index}].seqlen", f"{what}: overlaps {key}[{prev_index}] "
                                        f"at [{low}, {covered_to})", allowed)
                    if low > covered_to:
                        raise self.fail(key, f"{what}: seqlen [{covered_to}, {low}) is missing", allowed)
                    covered_to, prev_index = entry.seqlen_max, index
                if covered_to is not None:
                    raise self.fail(key, f"{what}: seqlen [{covered_to}, inf) is missing", allowed)


def _type_name(kind: type | tuple) -> str:
    names = {str: "a string", dict: "a mapping", list: "a list", type(None): "null", int: "an integer"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate one profile YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ProfileError(f"{path}: (file): cannot read it ({err.strerror}); allowed: a readable YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ProfileError(f"{path}: {where}: malformed YAML ({problem}); allowed: "
                           f"a YAML mapping as {profiles_doc()} describes") from None
    return _Validator(path).profile(data)


# ---------------------------------------------------------------- finding and selecting

def list_profiles(directory: str | os.PathLike | None = None) -> list[Profile]:
    """All profiles in `directory` (default: the shipped ones), sorted by name."""
    root = Path(directory) if directory is not None else profiles_dir()
    paths = sorted(root.glob("*.yaml")) + sorted(root.glob("*.yml"))
    return sorted((load_profile(p) for p in paths), key=lambda p: p.name)


def _looks_like_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or os.sep in text or Path(text).is_file()


def find_profile(name_or_path: str | os.PathLike, profiles: list[Profile] | None = None) -> Profile:
    """A profile by shipped name ("rtx4090") or by path to a YAML file."""
    text = str(name_or_path)
    if _looks_like_path(text):
        return load_profile(text)
    profiles = list_profiles() if profiles is None else profiles
    for profile in profiles:
        if profile.name == text:
            return profile
    names = [p.name for p in profiles]
    close = difflib.get_close_matches(text, names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ProfileError(f"profile: no profile named {text!r}{hint}; allowed: "
                       f"{', '.join(names)} or a path to a YAML file")


@dataclass(frozen=True)
class Selection:
    profile: Profile
    reason: str  # why it was chosen, for people


def match_profile(gpu: GpuInfo, profiles: list[Profile] | None = None) -> Selection | None:
    """The shipped profile for `gpu`: name patterns first, then compute capability.

    Among several name matches the longest pattern wins; among several compute
    capability matches the first by name wins, and the reason says so.
    """
    profiles = list_profiles() if profiles is None else profiles
    # Only profiles for this compute capability whose family runs here: "A10" also names
    # "RTX A1000" (fine, both sm_86), but an sm_80 profile must not land on an sm_86 card.
    candidates = [p for p in profiles if p.arch.compute_capability == gpu.compute_capability
                  and (gpu.arch is None or family_runs_on(p.family, gpu.arch))]
    by_name = [p for p in candidates if p.matching_name(gpu.name)]
    if by_name:
        best = min(by_name, key=lambda p: (-len(p.matching_name(gpu.name)), p.name))
        return Selection(best, f"matched by {best.match_reason(gpu)}")
    by_cc = [p for p in candidates if gpu.compute_capability in p.match_compute_capabilities]
    if not by_cc:
        return None
    cc = "{}.{}".format(*gpu.compute_capability)
    reason = f"no profile names {gpu.name!r}; matched by compute capability {cc}"
    if len(by_cc) > 1:
        reason += f" (also {', '.join(p.name for p in by_cc[1:])}; chose the first by name)"
    return Selection(by_cc[0], reason)


def closest_profile(gpu: GpuInfo, profiles: list[Profile]) -> Profile | None:
    """The profile to base a new one on: the nearest in compute capability (same arch first) among
    those whose kernels build for the GPU's arch (an sm90 profile's do not on sm_100a)."""
    def distance(p: Profile) -> tuple:
        same_arch = gpu.arch is not None and p.arch.name == gpu.arch.name
        major, minor = gpu.compute_capability
        pm, pn = p.arch.compute_capability
        return (not same_arch, abs(pm - major), abs(pn - minor), p.name)
    return next((p for p in sorted(profiles, key=distance) if gpu.arch is None or builds_for(p, gpu.arch)), None)


def builds_for(profile: Profile, arch: ArchFacts) -> bool:
    """Whether `flashtune build --profile P --arch A` compiles: P's family runs on A and every tile
    fits A's limits."""
    if not family_runs_on(profile.family, arch):
        return False
    try:
        specs_for_profile(profile, arch=arch.name)
    except SpecError:
        return False
    return True


def select_profile(name_or_path: str | os.PathLike | None = None, gpu: GpuInfo | None = None,
                   profiles: list[Profile] | None = None) -> Profile:
    """The explicit --profile if given, else the auto-match for `gpu`."""
    return select_profile_with_reason(name_or_path, gpu, profiles).profile


def select_profile_with_reason(name_or_path: str | os.PathLike | None = None, gpu: GpuInfo | None = None,
                               profiles: list[Profile] | None = None, for_arch: str | None = None) -> Selection:
    """`for_arch`: the arch a build targets, whose profiles the no-GPU error names."""
    if name_or_path is not None:
        return Selection(find_profile(name_or_path, profiles), "chosen with --profile")
    profiles = list_profiles() if profiles is None else profiles
    if gpu is None:
        named = [p.name for p in profiles if p.arch.name == for_arch]
        allowed = (f"--profile {' or '.join(named)} for {for_arch}" if named else
                   "--profile NAME (see `flashtune profiles`) or a path to a YAML file")
        raise ProfileError(f"profile: no GPU is visible to match a profile against; allowed: {allowed}")
    selection = match_profile(gpu, profiles)
    if selection is not None:
        return selection
    cc = "{}.{}".format(*gpu.compute_capability)
    closest = closest_profile(gpu, profiles)
    target = gpu.arch.name if gpu.arch else None
    if closest is None:
        near = f"no shipped profile builds for {target}; " if target else ""
    elif target and closest.arch.name != target:  # a profile for another arch: retargeted, and copied to run
        near = (f"none ships for {target}; the closest whose kernels build for it is {closest.name} "
                f"({closest.arch.name}, {closest.path}: `flashtune build --profile {closest.name} --arch {target}`; "
                f"to run it on this GPU, copy it with `arch: {target}`); ")
    else:
        near = f"the closest is {closest.name} ({closest.arch.name}, {closest.path}); "
    raise ProfileError(f"profile: no profile matches GPU {gpu.name!r} (compute capability {cc}); "
                       f"{near}allowed: --profile NAME or PATH; to write one, {how_to_write()}")
