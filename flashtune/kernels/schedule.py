"""The schedule of an sm90 kernel: which of the family's measured steps it takes.

Each field is a step of csrc/sm90 (kernel_traits.cuh lists them, docs/design-sm90.md says how
each works and what it measured on the H200). A profile config row may set any of them (its
YAML keys are the field names); the rest take the family's default for that tile, which
`default_schedule` derives from the head dim, the tile, causal and what fits in shared memory.
The resolved Schedule is part of the KernelSpec: it becomes the kernel's template argument, and
every field that differs from the default is spelled in the kernel's name, so a name determines
its code (the default kernels' names carry no suffix).
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Schedule:
    overlap: bool = True  # the softmax of S_j runs while P_(j-1) V_(j-1) is on the tensor cores
    pingpong: bool = True  # consumer warpgroups take turns issuing their wgmmas (2-3 consumers)
    persistent: bool = True  # one CTA per SM loops over the tiles
    lazy_rescale: bool = True  # a row keeps its maximum until a block's exceeds it by 2^8
    spec_max: bool = True  # exps against the maxima as they stand; S again where one moves
    tma_store: bool = True  # O staged in shared memory and stored by the TMA (else 16-byte stores)
    defer: bool = True  # a tile's epilogue runs under the next tile's S_0 (a second Q buffer)
    flat: bool = False  # a tile's last P V goes with the next tile's S_0 (needs defer)

    def suffix(self, default: Schedule) -> str:
        """The kernel-name suffix: one short code for each field that differs from `default`."""
        return "".join(f"_{NAME_CODES[f.name][getattr(self, f.name)]}" for f in fields(self)
                       if getattr(self, f.name) != getattr(default, f.name))

    def cpp(self, name: str = "KernelSchedule") -> str:
        """The struct kernel_traits.cuh's Traits takes as its Schedule argument."""
        values = ", ".join(f"{f.name} = {'true' if getattr(self, f.name) else 'false'}" for f in fields(self))
        return f"struct {name} {{\n  static constexpr bool {values};\n}};"


FIELD_NAMES = tuple(f.name for f in fields(Schedule))

# Kernel-name codes of a field's value where it differs from the default: (off, on). "np" is the
# name kernels without the pingpong have carried since the switch was a tile's.
NAME_CODES: dict[str, dict[bool, str]] = {
    "overlap": {False: "noov", True: "ov"},
    "pingpong": {False: "np", True: "pp"},
    "persistent": {False: "nopers", True: "pers"},
    "lazy_rescale": {False: "eager", True: "lazy"},
    "spec_max": {False: "nospec", True: "spec"},
    "tma_store": {False: "direct", True: "tma"},
    "defer": {False: "nodefer", True: "defer"},
    "flat": {False: "noflat", True: "flat"},
}

# The codes as words, for tables.
CODE_WORDS: dict[str, str] = {
    "noov": "no overlap", "ov": "overlap", "np": "no pingpong", "pp": "pingpong", "nopers": "not persistent",
    "pers": "persistent", "eager": "eager rescale", "lazy": "lazy rescale", "nospec": "no speculative maxima",
    "spec": "speculative maxima", "direct": "direct O stores", "tma": "TMA store", "nodefer": "epilogue not deferred",
    "defer": "deferred epilogue", "noflat": "no flat tiles", "flat": "flat tiles",
}


def suffix_words(suffix: str) -> str:
    """'_np_direct' -> 'no pingpong, direct O stores'."""
    return ", ".join(CODE_WORDS[code] for code in suffix.split("_") if code)


Overrides = tuple[tuple[str, bool], ...]  # a config row's schedule keys, in FIELD_NAMES order


def overrides_of(values: dict[str, bool]) -> Overrides:
    """A row's schedule keys as the hashable, ordered tuple a TileConfig carries."""
    return tuple((name, bool(values[name])) for name in FIELD_NAMES if name in values)


def overrides_label(overrides: Overrides) -> str:
    """How a tile's own schedule keys read after its shape in tables and tune results."""
    return "".join(f"_{NAME_CODES[name][value]}" for name, value in overrides)


def resolve(overrides: Overrides, hdim: int, causal: bool, consumers: int, o_tile_fits: bool,
            second_q_fits) -> Schedule:
    """The family's default for a tile, with the row's keys over it. Each default follows from
    the fields before it (a row that turns the overlap off gets no pingpong, no speculative maxima
    and no deferred epilogue by default), so that only what a row says can break a rule:
      pingpong    with 2-3 consumer warpgroups and the overlap (on its own measured +1-4%; off at
                  hdim 64 causal below 2k on the H200, where tiles are a few blocks long);
      spec_max    at hdim 64 and 128, with the overlap and lazy rescaling (hdim 256 spills with it);
      tma_store   where the O tile fits beside one Q tile and the rings;
      defer       with the overlap, on the persistent grid, where a second Q tile fits too
                  (second_q_fits(tma_store) says whether it does);
      flat        in causal kernels at hdim 64 (a loss of 2-7% in the others), with defer.
    """
    given = dict(overrides)

    def pick(name: str, default: bool) -> bool:
        return given.get(name, default)

    overlap = pick("overlap", True)
    persistent = pick("persistent", True)
    lazy = pick("lazy_rescale", True)
    pingpong = pick("pingpong", overlap and consumers > 1)
    spec = pick("spec_max", overlap and lazy and hdim <= 128)
    tma = pick("tma_store", o_tile_fits)
    defer = pick("defer", overlap and persistent and second_q_fits(tma))
    flat = pick("flat", causal and hdim == 64 and defer)
    return Schedule(overlap, pingpong, persistent, lazy, spec, tma, defer, flat)


def rule_problems(s: Schedule, consumers: int, o_tile_fits: bool, second_q_fits: bool) -> list[tuple[str, str, str]]:
    """Every rule the schedule breaks, as (key, problem, allowed); the kernel's static_asserts
    are the same rules."""
    problems = []
    if s.pingpong and not (s.overlap and consumers > 1):
        problems.append(("pingpong", "on without the overlap or with one consumer warpgroup",
                         "pingpong: true only with overlap and block_m 128 or 192"))
    if s.spec_max and not (s.overlap and s.lazy_rescale):
        problems.append(("spec_max", "on without the overlap or lazy rescaling",
                         "spec_max: true only with overlap and lazy_rescale"))
    if s.tma_store and not o_tile_fits:
        problems.append(("tma_store", "the O tile does not fit beside Q and the rings",
                         "tma_store: false here (fewer stages or a smaller tile make room)"))
    if s.defer and not (s.overlap and s.persistent):
        problems.append(("defer", "on without the overlap or the persistent grid",
                         "defer: true only with overlap and persistent"))
    elif s.defer and not second_q_fits:
        problems.append(("defer", "a second Q tile does not fit beside the rings" +
                         (" and the O tile" if s.tma_store else ""),
                         "defer: false here (or tma_store: false, or fewer stages)"))
    if s.flat and not s.defer:
        problems.append(("flat", "on without the deferred epilogue", "flat: true only with defer"))
    return problems

