"""The `flashtune` command line: options wired to the command modules (flashtune/commands/), and
the one way every command fails (a red line, an exit code, JSON with --json).

Adding a command: write its run and render in flashtune/commands/<name>.py, then a few lines here.
Options read alike in every command: `--json` prints the result as JSON on stdout, `--out FILE`
writes a file, lists are comma-separated and their option's singular is the same option
(`--hdims 64,128` = `--hdim 64 --hdim 128`).
"""
from __future__ import annotations

import json
import math
import os
import sys

import click

from flashtune import __version__
from flashtune.commands import common
from flashtune.commands.common import (EXIT_INPUT_ERROR, EXIT_INTERRUPTED, CliError, make_console, print_json,
                                       check_writable, progress_bar, require_gpu, resolve_profile, results_json,
                                       write_text)
from flashtune.kernels.profiles import ProfileError
from flashtune.kernels.spec import DTYPES as KERNEL_DTYPES, FP8_OUT_DTYPE, SpecError
from flashtune.kernels.tiles import MAX_HEAD_DIM, MIN_HEAD_DIM, computed_head_dim
from flashtune.kernels.toolchain import ToolchainError
from flashtune.measure.backends import DEFAULT_BACKENDS
from flashtune.paths import CacheDirError

# What a person did wrong (or must fix on the machine): one red line, no traceback.
USER_ERRORS = (ProfileError, SpecError, ToolchainError, CacheDirError, ValueError)
DTYPES = tuple(KERNEL_DTYPES)
# What a person can do after Ctrl-C, per command (the others simply stop).
INTERRUPTED_HINTS = {
    "tune": "; every measured result is kept in the tune's cache: run the same command again to resume",
    "build": "; kernels already built stay in the cache: run the same command again to build the rest",
}
DEPRECATED = "{old} is deprecated and goes in the next release; {new}"
# The --out files this process has written a checkpoint to: an error is added to them, where a
# file it has not written (an earlier run's result) is never overwritten by one.
_CHECKPOINTED: set[str] = set()


class FlashtuneGroup(click.Group):
    """Every failure reads alike: click's usage errors, flashtune's input errors, a command's own
    and Ctrl-C are one red `error:` line on stderr, with an exit code that says which (README);
    with --json (or bench's --out), also a JSON object {"error", "exit_code"} where the command's
    JSON would go."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = _without_deprecated_forms(list(sys.argv[1:] if args is None else args))
        _CHECKPOINTED.clear()  # a file an earlier command line in this process completed is not this one's
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:  # click's name for KeyboardInterrupt (and EOF at a prompt)
            message = "interrupted" + INTERRUPTED_HINTS.get(next(iter(args), ""), "")
            code = _report_error(message, EXIT_INTERRUPTED, self._json_destination(args))
        except click.ClickException as err:
            message = err.format_message()
            if isinstance(err, click.UsageError) and err.ctx is not None:
                message += f" (`{err.ctx.command_path} --help` lists the options)"
            code = _report_error(message, err.exit_code, self._json_destination(args))
        except CliError as err:
            code = _report_error(str(err), err.exit_code, self._json_destination(args))
        except USER_ERRORS as err:
            code = _report_error(str(err), EXIT_INPUT_ERROR, self._json_destination(args))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def _json_destination(self, args: list[str]) -> str | None:
        """Where this command line sends its JSON: '-' (stdout) for --json, the file of a JSON
        --out (bench's), None otherwise. Read off the arguments, so that it is known also when
        parsing them failed."""
        command, rest = self, args
        while isinstance(command, click.Group):
            names = [a for a in rest if not a.startswith("-")]
            sub = command.get_command(click.Context(command), names[0]) if names else None
            if sub is None:
                break
            command, rest = sub, rest[rest.index(names[0]) + 1:]
        params = {p.name for p in command.params}
        if "as_json" in params and "--json" in rest:
            return "-"
        if "json_out" in params:
            return _option_value(rest, "--out")
        return None


def _option_value(args: list[str], option: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == option:
            return args[i + 1] if i + 1 < len(args) else None
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def _without_deprecated_forms(args: list[str]) -> list[str]:
    """Old spellings still accepted for one release, each with a note: `bench --json FILE`
    (now `--out FILE`, or `--json` alone for stdout)."""
    if next((a for a in args if not a.startswith("-")), None) != "bench":
        return args
    out, i = [], 0
    while i < len(args):
        arg, value = args[i], None
        if arg.startswith("--json="):
            value = arg.split("=", 1)[1]
        elif arg == "--json" and i + 1 < len(args) and (args[i + 1] == "-" or not args[i + 1].startswith("-")):
            value, i = args[i + 1], i + 1
        if value is None:
            out.append(arg)
        else:
            out += ["--json"] if value == "-" else ["--out", value]
            click.secho("note: " + DEPRECATED.format(old=f"`bench --json {value}`",
                                                     new="use `--json` for stdout" if value == "-" else
                                                     f"use `--out {value}`"), fg="yellow", err=True)
        i += 1
    return out


def _report_error(message: str, exit_code: int, json_destination: str | None) -> int:
    click.secho(f"error: {message}", fg="red", err=True)
    if json_destination:
        error = {"error": message, "exit_code": exit_code}
        try:
            if json_destination in _CHECKPOINTED:  # this run's rows so far: keep them, mark the error
                with open(json_destination) as f:
                    write_text(json_destination, results_json({**json.load(f), **error}))
            elif json_destination != "-" and os.path.isfile(json_destination):
                click.secho(f"note: {json_destination} is left as it was (an earlier result)", err=True)
            elif not os.path.isdir(json_destination):
                write_text(json_destination, json.dumps(error, indent=2))
        except (OSError, ValueError, CliError):
            pass  # the red line above still says it
    return exit_code


# ---------------------------------------------------------------------------- shared options

def _split(values, example: str) -> list[str] | None:
    """The comma-separated items of a list option's values; None when the option was not given. A
    list given empty (`--hdims ,`) is an error: it would otherwise mean the default, everything."""
    if not values:
        return None
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter(f"an empty list; give at least one value, e.g. {example}")
    return items


def _int_list_from(minimum: int, example: str):
    """A callback for a list of integers of at least `minimum`."""
    def check(ctx, param, values):
        items = _split(values, example)
        if items is None:
            return None
        try:
            numbers = [int(v) for v in items]
        except ValueError:
            raise click.BadParameter(f"{','.join(values)!r}: expected comma-separated integers, e.g. {example}")
        bad = [n for n in numbers if n < minimum]
        if bad:
            raise click.BadParameter(f"{', '.join(map(str, bad))}: each value must be {minimum} or more")
        return numbers
    return check


_int_list = _int_list_from(1, "64,128")


def _head_dims(ctx, param, values):
    hdims = _int_list(ctx, param, values)
    bad = [d for d in hdims or () if computed_head_dim(d) is None]
    if bad:
        raise click.BadParameter(f"{', '.join(map(str, bad))}: a head dim is a multiple of 8 from {MIN_HEAD_DIM} "
                                 f"to {MAX_HEAD_DIM}")
    return hdims


def _choice_list(choices: tuple[str, ...]):
    def check(ctx, param, values):
        picked = _split(values, ",".join(choices[:2]))
        if picked is None:
            return None
        bad = [v for v in picked if v not in choices]
        if bad:
            raise click.BadParameter(f"{', '.join(bad)}; allowed: {', '.join(choices)}")
        return picked
    return check


def _tile_shapes(ctx, param, values):
    items = _split(values, "128x128,128x176")
    if items is None:
        return None
    try:
        shapes = [tuple(int(x) for x in v.lower().split("x", 1)) for v in items]
        if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
            raise ValueError
        return shapes
    except ValueError:
        raise click.BadParameter(f"{','.join(values)!r}: expected comma-separated BLOCK_MxBLOCK_N, "
                                 "e.g. 128x128,128x176")


def list_option(plural: str, singular: str | None, help: str, callback=_int_list, metavar: str = "N[,N...]"):
    """A list option: comma-separated or repeated, its singular (if any) the same option."""
    names = [plural, singular] if singular else [plural]
    same = f"; {singular} is the same option" if singular else ""
    return click.option(*names, plural.lstrip("-").replace("-", "_"), multiple=True, callback=callback,
                        metavar=metavar, help=f"{help} Comma-separated{same}.")


def hdims_option(help: str, built: bool = False):
    """--hdims; `built`: head dims flashtune builds kernels for (build, tune), else any (bench and
    verify --sdpa ask other backends too, and flashtune's row says why it has none)."""
    return list_option("--hdims", "--hdim", help, _head_dims if built else _int_list)


def dtypes_option(help: str):
    return list_option("--dtypes", "--dtype", help, _choice_list(DTYPES), "|".join(DTYPES))


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as JSON on stdout (errors too) instead of tables.")
profile_option = click.option("--profile", "profile_name", metavar="NAME|PATH",
                              help="A shipped profile's name or a YAML file (default: the one matching this GPU).")
causal_option = click.option("--causal/--no-causal", default=None, help="Only causal / only non-causal (default both).")


def _given(options: dict[str, str]) -> dict[str, str]:
    """Of {parameter name: flag}, those the command line gave (not defaults)."""
    ctx = click.get_current_context()
    return {name: flag for name, flag in options.items()
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}


def _causal_values(causal: bool | None) -> tuple[bool, ...]:
    return (False, True) if causal is None else (causal,)


# ---------------------------------------------------------------------------- commands

@click.group(cls=FlashtuneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flashtune")
def cli() -> None:
    """Detect the GPU, pick a tile profile, build, verify and benchmark flashtune's attention kernel."""


@cli.command("detect")
@json_option
@click.option("--arch", help="Describe a target arch you do not have, e.g. sm_89, sm_90a, sm_120.")
@click.option("--gpu", "gpu_name", help='Describe a target GPU by name, e.g. "RTX 4090".')
def detect_command(as_json: bool, arch: str | None, gpu_name: str | None) -> None:
    """GPU, arch, capabilities, toolchain and matching profile.

    Exit code 0 when a GPU was detected (or a target described), 3 when no GPU is visible.
    """
    from flashtune.commands import detect

    report = detect.collect_report(arch=arch, gpu_name=gpu_name)
    print_json(report.to_json()) if as_json else detect.render(report, make_console())
    sys.exit(report.exit_code)


@cli.group("profiles", cls=FlashtuneGroup, invoke_without_command=True)
@json_option
@click.pass_context
def profiles_command(ctx: click.Context, as_json: bool) -> None:
    """List the shipped profiles (`profiles show NAME` for one)."""
    from flashtune.commands import profiles
    from flashtune.kernels.profiles import list_profiles

    if ctx.invoked_subcommand is not None:
        return
    shipped = list_profiles()
    print_json([profiles.summary(p) for p in shipped]) if as_json else profiles.render_list(shipped, make_console())


@profiles_command.command("show")
@click.argument("name_or_path")
@json_option
def profiles_show_command(name_or_path: str, as_json: bool) -> None:
    """One profile with derived numbers: threads, shared memory, CTAs per SM."""
    from flashtune.commands import profiles
    from flashtune.kernels.profiles import find_profile

    as_json = as_json or click.get_current_context().parent.params["as_json"]  # `profiles --json show` too

    profile = find_profile(name_or_path)
    print_json(profiles.details(profile)) if as_json else profiles.render_details(profile, make_console())


@cli.command("build")
@profile_option
@click.option("--arch", help="Target arch, e.g. sm_89, sm_90, sm_120 (default: the profile's). "
                             "Cross-compiles: no GPU needed.")
@hdims_option("Only these head dims.", built=True)
@dtypes_option("Only these dtypes.")
@click.option("--force", is_flag=True, help="Rebuild even what the cache holds.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compiles (default: one per core and 2 GB of memory).")
@click.option("--verbose", is_flag=True, help="Print each kernel's build log path and ptxas report.")
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Also the decode kernels (queries of at most 16 rows, the KV-cache functions): 30 per dtype, "
                   "else compiled on their first call.")
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Also the backward kernels (the gradients of flash_attn_func and flash_attn_varlen_func): per "
                   "dtype, head dim 64 and 128, causal and not; else compiled on a training step's first call.")
@click.option("--narrow/--no-narrow", default=True, show_default=True,
              help="sm90 profiles: also each 16-bit prefill kernel's narrow twin, which reads a head dim between the "
                   "built ones (Phi-3's 96) or a V head dim unlike Q/K's in place, and the kernels with V's own "
                   "head dim (MLA's 192/128, 128/64); else compiled on such a call's first use.")
@json_option
def build_command(profile_name, arch, hdims, dtypes, force, jobs, verbose, decode, backward, narrow, as_json) -> None:
    """JIT-compile a profile's attention kernels into the cache.

    One kernel per (dtype, head dim, causal, tile) of the profile, each with its exact,
    config-named symbol; the decode kernels (per dtype, head dim, packed rows, causal and
    cache layout); the backward kernels; plus the torch binding. Example:

    \b
        flashtune build --profile rtx5090 --arch sm_120

    Exit codes: 0 built or cached, 1 a compile failed, 2 bad input or toolchain, 130 interrupted.
    """
    from flashtune.commands import build

    profile, reason = resolve_profile(profile_name, arch)
    console = None if as_json else make_console()
    if console:
        console.print(f"profile [bold]{profile.name}[/] ({reason})")
    report = build.run_build(profile, arch, dtypes, hdims, force, jobs, console, decode=decode, backward=backward,
                             narrow=narrow)
    if as_json:
        print_json(report.to_json())
    else:
        build.render(report, console, verbose)
    sys.exit(report.exit_code)


@cli.command("verify")
@profile_option
@click.option("--expect-kernel", metavar="NAME",
              help="Assert this exact kernel name launches for every case (instead of each case's spec).")
@click.option("--sdpa", is_flag=True, help="Report which backend PyTorch's own SDPA picks for these shapes, and why.")
@hdims_option("With --sdpa: head dims (default 128).")
@list_option("--seqlens", "--seqlen", "With --sdpa: sequence lengths (default 4096).")
@dtypes_option("With --sdpa: dtypes (default bfloat16).")
@causal_option
@click.option("--jobs", type=click.IntRange(min=1),
              help="Parallel compiles of the kernels the checks need (default: by cores and memory).")
@json_option
def verify_command(profile_name, expect_kernel, sdpa, hdims, seqlens, dtypes, causal, jobs, as_json) -> None:
    """Prove the loaded kernel is the expected one and that its results are right.

    Correctness matrix against an fp32 reference (bar: SDPA's error on the same inputs);
    the exact kernel name in the profiler and no other attention kernel; HMMA/LDSM/LDGSTS
    (sm80 family) in the SASS and no LDL/STL without ptxas-reported spills. The kernels the
    matrix launches are compiled first, side by side (cached: a second run builds nothing). Examples:

    \b
        flashtune verify --profile h200-sm80
        flashtune verify --sdpa --hdim 128 --seqlen 8192 --causal

    Exit codes: 0 all passed, 1 a check failed, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    from flashtune.commands import verify

    sdpa_only = list(_given({"hdims": "--hdims", "seqlens": "--seqlens", "dtypes": "--dtypes",
                             "causal": "--causal"}).values())
    profile_only = list(_given({"profile_name": "--profile", "expect_kernel": "--expect-kernel",
                                "jobs": "--jobs"}).values())
    if sdpa and profile_only:
        raise click.UsageError(f"{', '.join(profile_only)}: not an option of verify --sdpa (it asks PyTorch, "
                               "not a profile)")
    if not sdpa and sdpa_only:
        raise click.UsageError(f"{', '.join(sdpa_only)}: only with --sdpa; verify checks every case of the profile")
    require_gpu("verify")
    console = make_console()
    if sdpa:
        reports = [verify.sdpa_report(dtype, hdim, seqlen, is_causal)
                   for dtype in dtypes or ["bfloat16"] for hdim in hdims or [128]
                   for seqlen in seqlens or [4096] for is_causal in _causal_values(causal)]
        print_json([r.to_json() for r in reports]) if as_json else verify.render_sdpa(reports, console)
        return
    profile, reason = resolve_profile(profile_name)
    import torch

    from flashtune.runtime import ops

    ops.use_profile(profile.path)
    if not as_json:
        console.print(f"profile [bold]{profile.name}[/] ({reason})")
    kernels = verify.verify_kernels(profile, torch.cuda.current_device())
    steps = len(kernels) + len(verify.correctness_cases(profile))  # the builds, then the cases
    with progress_bar("verify", None if as_json else console, steps) as bar:
        report = verify.run_verify(profile, expect_kernel, on_progress=lambda case: bar.advance(case.name),
                                   jobs=jobs, kernels=kernels, on_built=lambda spec: bar.advance(f"built {spec.name}"))
    print_json(report.to_json()) if as_json else verify.render(report, console)
    sys.exit(report.exit_code)


def _profile_with_hdims(profile_name: str | None, hdims):
    """tune --decode's and --backward's profile, every --hdims value one of its head dims (exit 2 if not)."""
    profile, _ = resolve_profile(profile_name)
    unknown = sorted(set(hdims or ()) - set(profile.head_dims))
    if unknown:
        raise click.BadParameter(f"{unknown} not in profile {profile.name}'s head dims", param_hint="--hdims")
    return profile


@cli.command("tune")
@click.option("--profile", "profile_name", metavar="NAME|PATH",
              help="Starting profile: family, arch and starting tiles (default: this GPU's match).")
@hdims_option("Head dims to tune (default: the profile's).", built=True)
@causal_option
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True,
              help="The dtype candidates are timed in (the written tiles serve every dtype).")
@click.option("--max-candidates", type=click.IntRange(min=1), help="Per (hdim, causal); starting tiles always kept.")
@list_option("--tiles", "--tile", "Only these block_m x block_n shapes (every stage and warp count of the search "
             "grid, and on sm90 each with the pingpong on and off), besides the starting tiles.",
             _tile_shapes, "MxN[,MxN...]")
@click.option("--time-budget", type=click.FloatRange(min=1), help="Seconds; stop measuring after this and "
              "write what was found (rerun to resume).")
@click.option("--max-spill-bytes", type=click.IntRange(min=0), default=64, show_default=True,
              help="Reject candidates whose ptxas spills exceed this.")
@click.option("--repeats", type=click.IntRange(min=3), default=20, show_default=True)
@click.option("--final-round", type=click.IntRange(min=0), default=3, show_default=True,
              help="Per bucket, time this many fastest candidates and the starting tile again side by side "
                   "(interleaved, same inputs) and pick from that; 0: the first pass decides.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compiles (default: by cores and memory).")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="Time candidates on this many local GPUs at once (one worker each).")
@click.option("--fp8", is_flag=True, help="Tune the FP8 Q/K twins instead (profiles with fp8: {qk: e4m3}); "
              "the winners become the written profile's fp8.configs, its 16-bit tiles stay.")
@click.option("--fp8-all", "fp8_all", is_flag=True,
              help="Tune the all-FP8 twins instead (Q, K, P and V in e4m3; sm90 profiles with fp8: {qk: e4m3, "
                   "pv: e4m3}; bfloat16): tiles whose block_n is whole 64-key panels, checked against fp32 with "
                   "P's rounding allowed for; the winners become fp8.pv_configs, the other tiles stay.")
@click.option("--cache", "cache_path", metavar="FILE.jsonl", help="Resumable results cache "
              "(default: under the flashtune cache dir, per GPU and profile).")
@click.option("--name", help="Name of the written profile (default: <profile>-tuned).")
@click.option("--out", metavar="FILE.yaml", help="Where to write it (default: ./<name>.yaml).")
@click.option("--decode", is_flag=True,
              help="Tune the decode kernels instead: their tiles (per head dim and packed rows, on decode cells), "
                   "then the split policy (every split count timed on 10 cells per head dim, the cost model's "
                   "constants fitted); the written profile keeps the prefill tiles and gets a decode: section.")
@click.option("--backward", is_flag=True,
              help="Tune the backward kernel instead: per head dim (64, 128, 256), every backward kernel the arch takes "
                   "(wgmma on sm_90a below 256, mma.sync with 8, 4 or 2 warps) timed on the backward "
                   "alone; the written profile keeps everything else and gets a backward: section.")
@json_option
def tune_command(profile_name, hdims, causal, dtype, max_candidates, tiles, time_budget, max_spill_bytes, repeats,
                 final_round, jobs, gpus, fp8, fp8_all, cache_path, name, out, decode, backward, as_json) -> None:
    """Search tile configs on this GPU and write a tuned profile YAML.

    Candidates (restricted by the arch's limits, starting tiles included) are compiled in
    parallel, checked against the fp32 reference, then timed per seqlen bucket (512, 1k, 4k and 16k
    stand for [0, 1k), [1k, 2k), [2k, 8k) and [8k, inf), split further at the profile's own edges); each bucket's
    fastest few and the starting tile are timed again side by side, which decides. Failures
    are recorded with their reason and never retried; an interrupted tune resumes. Examples:

    \b
        flashtune tune --profile h200-sm80 --hdims 128 --out my-h200.yaml
        flashtune tune --profile h200 --hdims 64,128 --tiles 128x128,128x176
        flashtune tune --decode --hdims 128
        flashtune tune --backward --profile h200

    Exit codes: 0 written, 1 nothing could be measured, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    from flashtune.commands import tune
    from flashtune.tuning import search

    if decode and backward:
        raise click.UsageError("--decode and --backward: one at a time (each writes its own section)")
    if decode or backward:
        prefill_only = {"causal": "--causal", "max_candidates": "--max-candidates", "tiles": "--tiles",
                        "time_budget": "--time-budget", "final_round": "--final-round", "gpus": "--gpus",
                        "fp8": "--fp8", "fp8_all": "--fp8-all", "cache_path": "--cache"}
        given = list(_given(prefill_only).values())
        if given:
            which = "decode" if decode else "backward"
            raise click.UsageError(f"{', '.join(given)}: not an option of tune --{which} (it times every {which} "
                                   "tile the arch takes, side by side)")
    if fp8 and fp8_all:
        raise click.UsageError("--fp8 and --fp8-all: one at a time (each writes its own table)")
    if fp8_all and dtype != FP8_OUT_DTYPE:
        raise click.BadParameter(f"the all-FP8 kernels write {FP8_OUT_DTYPE} only; leave --dtype out",
                                 param_hint="--dtype")
    check_writable(out, "--out")  # (--cache makes its folders)
    gpus_seen = require_gpu("tune")
    if backward:
        from flashtune.kernels.bwd_spec import BWD_HEAD_DIMS
        from flashtune.tuning.backward_search import backward_hdims, run_backward_tune

        profile = _profile_with_hdims(profile_name, hdims)
        chosen = backward_hdims(hdims or profile.head_dims)
        if not chosen:
            raise click.BadParameter(f"the backward kernels take head dims {', '.join(map(str, BWD_HEAD_DIMS))}",
                                     param_hint="--hdims")
        console = make_console(stderr=as_json)
        with progress_bar("tune --backward", console) as bar:
            result = run_backward_tune(profile, dtype, tuple(chosen), repeats, jobs, max_spill_bytes,
                                       on_event=lambda stage, done, total: bar.update(done, total, stage))
        name = name or f"{profile.name}-tuned"
        written, prov = tune.write_backward_tuned(profile, result, dtype, gpus_seen[0].name, name,
                                                  out or f"{name}.yaml")
        if as_json:
            print_json({"profile": str(written.path), "backward_tune": prov["backward_tune"]})
        else:
            tune.render_backward(result, console)
            console.print(f"wrote [bold]{written.path}[/] (profile {written.name}; validated)")
        return
    if decode:
        from flashtune.tuning.decode_search import run_decode_tune

        profile = _profile_with_hdims(profile_name, hdims)
        console = make_console(stderr=as_json)
        from flashtune.tuning.split_fit import run_split_fit, with_decode_tiles

        with progress_bar("tune --decode", console) as bar:
            progress = lambda stage, done, total: bar.update(done, total, stage)  # noqa: E731
            result = run_decode_tune(profile, dtype, tuple(hdims or profile.head_dims), repeats, jobs,
                                     max_spill_bytes, on_event=progress)
            split = run_split_fit(with_decode_tiles(profile, result.winners), dtype, tuple(hdims or profile.head_dims),
                                  repeats, on_event=progress)
        name = name or f"{profile.name}-tuned"
        written, prov = tune.write_decode_tuned(profile, result, split, dtype, gpus_seen[0].name, name,
                                                out or f"{name}.yaml")
        if as_json:
            print_json({"profile": str(written.path), "decode_tune": prov["decode_tune"]})
        else:
            tune.render_decode(result, console)
            tune.render_split_fit(split, console)
            console.print(f"wrote [bold]{written.path}[/] (profile {written.name}; validated)")
        return
    if gpus > len(gpus_seen):
        raise click.BadParameter(f"{gpus} GPUs asked for, {len(gpus_seen)} visible", param_hint="--gpus")
    profile, _ = resolve_profile(profile_name)
    fp8 = fp8 or fp8_all
    for note in tune.check_request(profile, gpus_seen[0], hdims, tiles, fp8, fp8_all):
        click.secho(f"note: {note}", fg="yellow", err=True)
    opts = search.TuneOptions(hdims=tune.tuned_hdims(profile, hdims, fp8), causal=_causal_values(causal), dtype=dtype,
                              max_candidates=max_candidates, shapes=tuple(tiles or ()), time_budget_s=time_budget,
                              max_spill_bytes=max_spill_bytes, repeats=repeats, final_round=final_round,
                              jobs=jobs, gpus=gpus, fp8=fp8, fp8_pv=fp8_all)
    console = make_console(stderr=as_json)
    with progress_bar("tune", console) as bar:
        result = search.run_tune(profile, gpus_seen[0].name, opts, cache_path,
                                 on_event=lambda stage, done, total: bar.update(done, total, stage))
    if not result.winners:
        tune.render(result, console)
        raise CliError("no candidate could be measured; nothing written", common.EXIT_FAILED)
    name = name or f"{profile.name}-tuned"
    written, prov = tune.write_tuned(profile, result, opts, gpus_seen[0].name, name, out or f"{name}.yaml")
    if as_json:
        print_json(tune.summary(written, prov, result))
    else:
        tune.render(result, console)
        console.print(f"wrote [bold]{written.path}[/] (profile {written.name}; validated)")


@cli.command("memory")
@click.option("--model", "model_name", metavar="NAME|CONFIG.json",
              help="A built-in shape (llama3-8b-like, llama3-70b-like, qwen2-7b-like, mistral-7b-like) or a "
                   "transformers config.json. Without it, give --layers --heads --hdim.")
@click.option("--layers", type=click.IntRange(min=1))
@click.option("--heads", type=click.IntRange(min=1))
@click.option("--kv-heads", type=click.IntRange(min=1), help="Default: --heads (no GQA).")
@click.option("--hdim", type=click.IntRange(min=1), help="The model's head dim (one value: it describes one model).")
@click.option("--hidden", type=click.IntRange(min=1), help="Default: heads x hdim.")
@click.option("--intermediate", type=click.IntRange(min=1), help="MLP width (default: Llama's 8/3 x hidden).")
@click.option("--vocab", type=click.IntRange(min=1))
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seqlen", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32", "fp8", "int8", "int4"]),
              default="bfloat16", show_default=True, help="Weights and activations.")
@click.option("--kv-dtype", type=click.Choice(["bfloat16", "float16", "float32", "fp8", "int8", "int4"]),
              help="KV cache (default: --dtype).")
@click.option("--gpu-memory", type=click.FloatRange(min=0, min_open=True), metavar="GIB",
              help="Judge against this much memory (default: the first visible GPU's).")
@json_option
def memory_command(model_name, layers, heads, kv_heads, hdim, hidden, intermediate, vocab, batch, seqlen, dtype,
                   kv_dtype, gpu_memory, as_json) -> None:
    """What a model needs in GPU memory, and what a flash kernel changes.

    Three accounts: weights (fixed), the KV cache (linear in batch x seqlen) and the attention
    score matrix that a non-flash kernel materialises (quadratic in seqlen, one layer at a
    time), plus one layer's activations and torch's cuBLAS workspace; then a verdict against the
    GPU and what helps.

    \b
        flashtune memory --model llama3-8b-like --batch 4 --seqlen 32768
        flashtune memory --layers 32 --heads 32 --kv-heads 8 --hdim 128 --seqlen 131072 --gpu-memory 24
    """
    from flashtune.commands import memory

    model, assumed = memory.model_from_options(model_name, layers=layers, heads=heads, kv_heads=kv_heads,
                                               head_dim=hdim, hidden=hidden, intermediate=intermediate, vocab=vocab)
    if gpu_memory is not None:
        if not math.isfinite(gpu_memory):
            raise click.BadParameter(f"{gpu_memory}: give the GPU's memory in GiB, e.g. 24", param_hint="--gpu-memory")
        gpu_bytes = int(gpu_memory * 2**30)
    else:
        gpus = common.detect_gpus()
        gpu_bytes = gpus[0].memory_bytes if gpus else None
    report = memory.report(model, batch, seqlen, gpu_bytes, dtype, kv_dtype, assumed)
    print_json(report.to_json()) if as_json else memory.render(report, make_console())


@cli.command("bench")
@profile_option
@list_option("--seqlens", "--seqlen", "Sequence lengths (default 512,...,16384).")
@hdims_option("Head dims (default 64,128,256).")
@list_option("--batches", "--batch", "Batch sizes (default 16384 // seqlen; --model: 1,16; --decode: 1,8,32,128).")
@click.option("--heads", type=click.IntRange(min=1), help="Query heads (default 2048 // hdim; --decode: 32).")
@list_option("--heads-kv", None, "K/V heads for GQA/MQA (default = heads; --decode: 1,8,32).")
@causal_option
@dtypes_option("Dtypes (default bfloat16).")
@list_option("--backends", "--backend", f"Absent ones show as such (default {','.join(DEFAULT_BACKENDS)}).",
             callback=lambda ctx, param, values: _split(values, "flashtune,sdpa"), metavar="NAME[,NAME...]")
@click.option("--repeats", type=click.IntRange(min=3), default=30, show_default=True,
              help="Timed runs per row, in 3 rounds interleaved with the other backends (median reported).")
@json_option
@click.option("--out", "json_out", metavar="FILE.json",
              help="Write the result as JSON to FILE (the table still shows); rewritten after each shape, problem "
                   "or model row, marked \"complete\": false until the run ends, so an interrupted run keeps its rows.")
@click.option("--csv", "csv_path", metavar="FILE.csv", help="Write the rows as CSV ('-' for stdout).")
@click.option("--plot", "plot_path", metavar="FILE.png",
              help="TFLOPS vs seqlen plot; with --model: TTFT, decode tok/s and memory (needs the plot extra).")
@click.option("--model", "model_name", metavar="NAME|CONFIG.json",
              help="Model-level A/B instead of the kernel grid: a built-in shape (see `flashtune memory "
                   "--help`) or a config.json, random weights; or `recall`: a small model the bench trains on "
                   "associative recall (once, then cached), whose rows add its task accuracy and agreement with "
                   "fp32 math. Backends: flashtune (prefill and decode), sdpa (its default), sdpa-*, eager.")
@click.option("--layers", type=click.IntRange(min=1), help="With --model: fewer layers, to fit.")
@list_option("--prefill", None, "With --model: prompt lengths (default 1024,16384,65536,131072; a row that "
                                "`flashtune memory` predicts not to fit the GPU is not run, and says so).")
@click.option("--decode-steps", type=click.IntRange(min=5), default=256, show_default=True,
              help="With --model: greedy tokens generated with the KV cache (the first 4 are not timed: the "
                   "prefill's, the profiled step's, the CUDA graph's warm-up and its first replay).")
@click.option("--decode", is_flag=True,
              help="Decode steps instead of the prefill grid: query tokens against a full KV cache (flashtune's "
                   "flash_attn_with_kvcache, SDPA's backends, flash-attn's KV-cache functions); microseconds, GB/s "
                   "of K/V read and its fraction of a device-to-device copy.")
@list_option("--caches", "--cache", "With --decode: keys per sequence (default 1024,16384,131072).")
@list_option("--seqlens-q", "--seqlen-q", "With --decode: query tokens per sequence, causal above 1 (default 1,4).")
@list_option("--pages", "--page", "With --decode: page sizes of a paged cache, 0 for contiguous (default 0).",
             _int_list_from(0, "0,16,64"))
@click.option("--kv-dtype", type=click.Choice(["e4m3"]),
              help="With --decode: flashtune also reads each cache stored in e4m3 (one descale per KV head), its "
                   "row (backend flashtune-fp8kv) beside its 16-bit one; the other backends read 16 bits. GB/s "
                   "count the 16-bit bytes, so an e4m3 row can pass the copy bandwidth.")
@click.option("--pass", "pass_name", type=click.Choice(["fwd", "bwd", "fwd+bwd"]), default="fwd", show_default=True,
              help="The prefill grid's pass: the forward, the backward alone (dq, dk, dv from a kept forward) or "
                   "both; TFLOPS count the backward as 2.5 forwards (FlashAttention's count); the error column "
                   "is dq's.")
@click.option("--window", type=click.IntRange(min=1), metavar="KEYS",
              help="The prefill grid's causal cells with a sliding window (Mistral's sliding_window=KEYS: each query "
                   "sees its own key and the KEYS-1 before it); cells no longer than the window are plain causal. "
                   "TFLOPS count only the pairs inside the window (flashtune skips the blocks outside; SDPA gets it "
                   "as a mask, which its flash kernel refuses).")
@click.option("--hdim-v", type=click.IntRange(min=8), metavar="D",
              help="The prefill grid with V's head dim D unlike Q/K's (--hdims; e.g. --hdims 192 --hdim-v 128, "
                   "DeepSeek's MLA prefill): the output takes V's; TFLOPS count 2·pairs·(hdim + D). Forward only.")
@click.option("--train", is_flag=True,
              help="Training instead of the prefill grid: a small Llama-style model (GQA, head dim 64) trained "
                   "from one seed on associative recall with each backend in forward and backward (default sdpa "
                   "and flashtune; the first twice, for run-to-run noise): final loss against the first "
                   "backend's, ms per step, tokens/s, peak memory, loss curves (--plot).")
@click.option("--train-steps", type=click.IntRange(min=20), default=300, show_default=True,
              help="With --train: optimizer steps per run (two thirds at 1k tokens, a third at 4k).")
def bench_command(profile_name, seqlens, hdims, batches, heads, heads_kv, causal, dtypes, backends, repeats,
                  as_json, json_out, csv_path, plot_path, model_name, layers, prefill, decode_steps, decode, caches,
                  seqlens_q, pages, kv_dtype, pass_name, window, hdim_v, train, train_steps) -> None:
    """Side-by-side A/B: flashtune against every attention backend present.

    Same shapes and inputs in one process, only the backend switched; median of CUDA-event
    GPU times (calls queued behind a spin kernel, so launch overhead is not in them), TFLOPS,
    peak memory, error against fp32, and the kernel that ran. Examples:

    \b
        flashtune bench --hdims 128 --seqlens 1024,4096 --out out.json --plot out.png
        flashtune bench --hdims 128 --seqlens 4096 --heads 32 --heads-kv 8 --causal --csv -
        flashtune bench --decode --hdims 128 --heads-kv 8 --batches 1,32 --caches 16384 --pages 0,64
        flashtune bench --decode --kv-dtype e4m3 --hdims 128 --heads-kv 8 --batches 8 --caches 131072
        flashtune bench --pass fwd+bwd --hdims 64,128 --causal
        flashtune bench --hdims 128 --seqlens 4096,32768 --batches 1 --window 4096
        flashtune bench --hdims 192 --hdim-v 128 --causal
        flashtune bench --train --train-steps 300 --out train.json --plot train.png

    Exit codes: 0 done, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    if as_json and csv_path == "-":
        raise click.UsageError("--json and --csv - both write to stdout; give --csv a file")
    for path, option in ((json_out, "--out"), (csv_path, "--csv"), (plot_path, "--plot")):
        check_writable(path, option)
    if plot_path:
        from flashtune.commands.bench import pyplot

        pyplot()  # matplotlib's absence said now, not after the run
    _check_bench_mode(model_name, decode, train)
    if model_name:  # a name it cannot take is said before the GPU is looked for
        from flashtune.commands.bench_model import check_model

        try:
            check_model(model_name, layers)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--model") from None
    require_gpu("bench")
    if profile_name:
        from flashtune.runtime import ops

        ops.use_profile(profile_name)
    console = make_console(stderr=as_json or csv_path == "-")  # stdout carries the data then
    if train:
        from flashtune.commands import bench_train as bench

        if dtypes:
            raise click.BadParameter("--train trains in bf16 autocast; drop it", param_hint="--dtypes")
        result = bench.run_train_bench(bench.backend_names(backends), train_steps, checkpoint=_checkpoint(json_out),
                                       progress=lambda message: console.print(message, highlight=False))
    elif model_name:
        from flashtune.commands import bench_model as bench

        if len(dtypes or ()) > 1:
            raise click.BadParameter("one dtype with --model", param_hint="--dtypes")
        result = bench.run_model_bench(model_name, bench.backend_names(backends),
                                       list(prefill or bench.DEFAULT_PREFILL),
                                       batch=list(batches or bench.DEFAULT_BATCHES), decode_steps=decode_steps,
                                       layers=layers,
                                       dtype=(dtypes or ["bfloat16"])[0], checkpoint=_checkpoint(json_out),
                                       progress=lambda message: console.print(message, highlight=False))
    elif decode:
        from flashtune.commands import bench_decode as bench
        from flashtune.measure import decode_problem as grid

        names = bench.backend_names(backends)
        if kv_dtype == "e4m3" and "flashtune-fp8kv" not in names:  # beside flashtune's 16-bit row
            names.insert(names.index("flashtune") + 1 if "flashtune" in names else 0, "flashtune-fp8kv")
        problems, too_big = [], 0
        for dtype in dtypes or ["bfloat16"]:
            found, skipped = grid.decode_grid(hdims or grid.DECODE_HDIMS, heads_kv or grid.DECODE_HEADS_KV,
                                              batches or grid.DECODE_BATCHES, caches or grid.DECODE_CACHES,
                                              seqlens_q or grid.DECODE_SEQLENS_Q, pages or (0,), dtype,
                                              heads or grid.DECODE_HEADS)
            problems, too_big = problems + found, too_big + skipped
        if too_big:
            console.print(f"[yellow]{too_big} cells left out: their K/V is over "
                          f"{grid.MAX_KV_BYTES / 2**30:.0f} GiB[/]")
        with progress_bar("bench --decode", console, len(problems)) as bar:
            result = bench.run_decode_bench(problems, names, repeats, on_problem=lambda p: bar.advance(p.label),
                                            checkpoint=_checkpoint(json_out))
        if csv_path:
            from flashtune.commands.bench import to_csv

            write_text(csv_path, to_csv(result.rows))
    else:
        from flashtune.commands import bench
        from flashtune.measure.problem import HDIMS, SEQLENS, fa_grid

        names = bench.backend_names(backends)
        if window and causal is False:
            raise click.BadParameter("a sliding window here is causal; drop --no-causal", param_hint="--window")
        if hdim_v and (hdim_v % 8 or hdim_v > 256):
            raise click.BadParameter(f"{hdim_v}: V's head dim is a multiple of 8 up to 256", param_hint="--hdim-v")
        if hdim_v and pass_name != "fwd":
            raise click.BadParameter("a V head dim unlike Q/K's is forward-only; drop --pass", param_hint="--hdim-v")
        shapes = [shape for dtype in dtypes or ["bfloat16"] for batch in batches or [None]
                  for kv in heads_kv or [None]
                  for shape in fa_grid(seqlens or SEQLENS, hdims or HDIMS, _causal_values(causal), dtype, batch,
                                       heads, kv, window or 0, hdim_v or 0)]
        with progress_bar("bench", console, len(shapes)) as bar:
            result = bench.run_bench(shapes, names, repeats, on_shape=lambda shape, rows: bar.advance(
                f"{shape.dtype} hdim {shape.hdim}" + (f"/{shape.hdim_v}" if shape.hdim_v else "")
                + f" causal={shape.causal}"
                + (f" window {shape.window}" if shape.window else "") + f" seqlen {shape.seqlen_q}"),
                checkpoint=_checkpoint(json_out), pass_name=pass_name)
        if csv_path:
            write_text(csv_path, bench.to_csv(result.rows))
    bench.render(result, console)
    if as_json:
        print_json(result.to_json())
    if json_out:
        write_text(json_out, results_json(result.to_json()))
    if plot_path:
        bench.plot(result, plot_path)


def _checkpoint(json_out: str | None):
    """bench --out FILE: the result so far, written after each shape, problem or row and marked
    incomplete, so a run that is interrupted or dies keeps what it measured; the end overwrites it."""
    if not json_out or json_out == "-":
        return None

    def write(result) -> None:
        write_text(json_out, results_json({**result.to_json(), "complete": False}))
        _CHECKPOINTED.add(json_out)
    return write


# Which options each bench mode takes (the prefill grid, --decode, --model); any other is an error,
# not silently ignored.
MODE_OPTIONS = {
    "grid": {"seqlens": "--seqlens", "hdims": "--hdims", "heads": "--heads", "heads_kv": "--heads-kv",
             "causal": "--causal", "repeats": "--repeats", "csv_path": "--csv", "batches": "--batches",
             "pass_name": "--pass", "window": "--window", "hdim_v": "--hdim-v"},
    "decode": {"hdims": "--hdims", "heads": "--heads", "heads_kv": "--heads-kv", "batches": "--batches",
               "caches": "--caches", "seqlens_q": "--seqlens-q", "pages": "--pages", "repeats": "--repeats",
               "csv_path": "--csv", "kv_dtype": "--kv-dtype"},
    "model": {"layers": "--layers", "prefill": "--prefill", "decode_steps": "--decode-steps", "batches": "--batches"},
    "train": {"train_steps": "--train-steps"},
}
MODE_NAMES = {"grid": "the prefill grid", "decode": "bench --decode", "model": "bench --model", "train": "bench --train"}


def _check_bench_mode(model_name: str | None, decode: bool, train: bool = False) -> None:
    modes = [flag for flag, given in (("--model", model_name), ("--decode", decode), ("--train", train)) if given]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)} are different benches; give one")
    mode = "model" if model_name else "decode" if decode else "train" if train else "grid"
    flags = {name: flag for options in MODE_OPTIONS.values() for name, flag in options.items()}
    given = [flag for name, flag in _given(flags).items() if name not in MODE_OPTIONS[mode]]
    if given:
        where = [MODE_NAMES[m] for m, options in MODE_OPTIONS.items()
                 if m != mode and all(f in options.values() for f in given)]
        raise click.UsageError(f"{', '.join(given)}: not an option of {MODE_NAMES[mode]}"
                               + (f" (only of {' or '.join(where)})" if where else ""))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
