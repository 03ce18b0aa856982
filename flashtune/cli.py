"""The `flashtune` command line. This file only wires options to the modules that do the work.

Adding a command: write its logic in its own module, then a few lines here.
"""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from flashtune import __version__, build_command, detect as detect_report, profile_report
from flashtune.profiles import ProfileError, find_profile, list_profiles
from flashtune.backends import BACKENDS, DEFAULT_BACKENDS
from flashtune.gpu import detect_gpus
from flashtune.paths import CacheDirError
from flashtune.spec import SpecError
from flashtune.toolchain import ToolchainError

EXIT_INPUT_ERROR = 2  # bad profile, bad option value, unusable toolchain (click uses 2 for usage too)
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a command it stopped

# What a person did wrong (or must fix on the machine): one red line, no traceback.
USER_ERRORS = (ProfileError, SpecError, ToolchainError, CacheDirError, ValueError)


class CliError(Exception):
    """A command's own failure, said in one line, with the exit code it means."""

    def __init__(self, message: str, exit_code: int = EXIT_INPUT_ERROR):
        super().__init__(message)
        self.exit_code = exit_code


class FlashtuneGroup(click.Group):
    """Every failure reads alike: click's usage errors, flashtune's input errors, a command's own
    and Ctrl-C are one red `error:` line on stderr, with an exit code that says which (README);
    with --json, also a JSON object {"error", "exit_code"} where the command's JSON would go."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:  # click's name for KeyboardInterrupt (and EOF at a prompt)
            code = _report_error("interrupted", EXIT_INTERRUPTED, self._json_destination(args))
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
        """Where this command line sends its JSON: '-' (stdout) for a --json switch, the file
        for bench's --json FILE, None without --json. Read off the arguments, so that it is
        known also when parsing them failed."""
        command, rest = self, args
        while isinstance(command, click.Group):
            names = [a for a in rest if not a.startswith("-")]
            sub = command.get_command(click.Context(command), names[0]) if names else None
            if sub is None:
                break
            command, rest = sub, rest[rest.index(names[0]) + 1:]
        option = next((p for p in command.params if "--json" in getattr(p, "opts", ())), None)
        if option is None:
            return None
        for i, arg in enumerate(rest):
            if arg == "--json":
                return "-" if option.is_flag else (rest[i + 1] if i + 1 < len(rest) else None)
            if arg.startswith("--json="):
                return arg.split("=", 1)[1]
        return None


def _report_error(message: str, exit_code: int, json_destination: str | None) -> int:
    click.secho(f"error: {message}", fg="red", err=True)
    if json_destination:
        text = json.dumps({"error": message, "exit_code": exit_code}, indent=2)
        try:
            _write(json_destination, text)
        except OSError:
            pass  # the red line above still says it
    return exit_code


def _require_gpu(command: str) -> list:
    gpus = detect_gpus()
    if not gpus:
        raise CliError(f"no GPU is visible; {command} needs one (see `flashtune detect`)", detect_report.EXIT_NO_GPU)
    return gpus


def make_console() -> Console:
    # Rich falls back to 80 columns when not on a terminal; wide tables would be cut.
    return Console(width=None if sys.stdout.isatty() else 160, soft_wrap=False)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2))


def _int_list(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 512,1024,4096")


def _tile_shapes(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        shapes = [tuple(int(x) for x in v.strip().lower().split("x", 1)) for v in value.split(",") if v.strip()]
        if not shapes or any(len(shape) != 2 for shape in shapes):
            raise ValueError
        return shapes
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated BLOCK_MxBLOCK_N, e.g. 128x128,128x176")


@click.group(cls=FlashtuneGroup)
@click.version_option(__version__, prog_name="flashtune")
def cli() -> None:
    """Detect the GPU, pick a tile profile, build, verify and benchmark flashtune's attention kernel."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--arch", help="Describe a target arch you do not have, e.g. sm_89, sm_90a, sm_120.")
@click.option("--gpu", "gpu_name", help='Describe a target GPU by name, e.g. "RTX 4090".')
def detect(as_json: bool, arch: str | None, gpu_name: str | None) -> None:
    """GPU, arch, capabilities, toolchain and matching profile.

    Exit code 0 when a GPU was detected (or a target described), 3 when no GPU is visible.
    """
    report = detect_report.collect_report(arch=arch, gpu_name=gpu_name)
    if as_json:
        print_json(report)
    else:
        detect_report.render_report(report, make_console())
    sys.exit(detect_report.exit_code(report))


@cli.group(cls=FlashtuneGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def profiles(ctx: click.Context, as_json: bool) -> None:
    """List the shipped profiles (`profiles show NAME` for one)."""
    if ctx.invoked_subcommand is not None:
        return
    shipped = list_profiles()
    if as_json:
        print_json([profile_report.summary(p) for p in shipped])
    else:
        profile_report.render_list(shipped, make_console())


@profiles.command("show")
@click.argument("name_or_path")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def profiles_show(name_or_path: str, as_json: bool) -> None:
    """One profile with derived numbers: threads, shared memory, CTAs per SM."""
    profile = find_profile(name_or_path)
    if as_json:
        print_json(profile_report.details(profile))
    else:
        profile_report.render_details(profile, make_console())


@cli.command()
@click.option("--profile", "profile_name", metavar="NAME|PATH",
              help="Profile to build (default: the one matching this machine's GPU).")
@click.option("--arch", help="Target arch, e.g. sm_89, sm_90, sm_120 (default: the profile's). "
                             "Cross-compiles: no GPU needed.")
@click.option("--hdim", "hdims", type=int, multiple=True, help="Only this head dim (repeatable).")
@click.option("--dtype", "dtypes", type=click.Choice(["float16", "bfloat16"]), multiple=True,
              help="Only this dtype (repeatable).")
@click.option("--force", is_flag=True, help="Rebuild even what the cache holds.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compiles (default: CPU count).")
@click.option("--verbose", is_flag=True, help="Print each kernel's build log path and ptxas report.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def build(profile_name, arch, hdims, dtypes, force, jobs, verbose, as_json) -> None:
    """JIT-compile a profile's attention kernels into the cache.

    One kernel per (dtype, head dim, causal, tile) of the profile, each with its exact,
    config-named symbol; plus the torch binding. Example:

    \b
        flashtune build --profile rtx5090 --arch sm_120

    Exit codes: 0 built or cached, 1 a compile failed, 2 bad input or toolchain, 130 interrupted.
    """
    profile, reason = build_command.resolve_profile(profile_name)
    console = None if as_json else make_console()
    if console:
        console.print(f"profile [bold]{profile.name}[/] ({reason})")
    report = build_command.run_build(profile, arch, dtypes, hdims, force, jobs, console)
    if as_json:
        print_json(report)
    else:
        build_command.render(report, console)
        if verbose:
            for k in report["kernels"]:
                console.print(f"{k['name']}: log {k['log']}")
    sys.exit(build_command.EXIT_BUILD_FAILED if report["failures"] else 0)


@cli.command()
@click.option("--profile", "profile_name", metavar="NAME|PATH",
              help="Profile to verify (default: the one matching this GPU).")
@click.option("--expect-kernel", metavar="NAME",
              help="Assert this exact kernel name launches for every case (instead of each case's spec).")
@click.option("--sdpa", is_flag=True, help="Report which backend PyTorch's own SDPA picks for a shape, and why.")
@click.option("--hdim", type=int, default=128, show_default=True, help="With --sdpa: head dim.")
@click.option("--seqlen", type=int, default=4096, show_default=True, help="With --sdpa: sequence length.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16", show_default=True,
              help="With --sdpa: dtype.")
@click.option("--causal/--no-causal", default=False, help="With --sdpa: causal mask.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify(profile_name, expect_kernel, sdpa, hdim, seqlen, dtype, causal, as_json) -> None:
    """Prove the loaded kernel is the expected one and that its results are right.

    Correctness matrix against an fp32 reference (bar: SDPA's error on the same inputs);
    the exact kernel name in the profiler and no other attention kernel; HMMA/LDSM/LDGSTS
    (sm80 family) in the SASS and no LDL/STL without ptxas-reported spills. Examples:

    \b
        flashtune verify --profile h200-sm80
        flashtune verify --sdpa --hdim 128 --seqlen 8192 --causal

    Exit codes: 0 all passed, 1 a check failed, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    from flashtune import verify as verify_mod, verify_report

    _require_gpu("verify")
    console = make_console()
    if sdpa:
        report = verify_mod.sdpa_report(dtype, hdim, seqlen, causal)
        print_json(report) if as_json else verify_report.render_sdpa(report, console)
        return
    profile, reason = build_command.resolve_profile(profile_name)
    from flashtune import ops

    ops.use_profile(profile.path)
    if not as_json:
        console.print(f"profile [bold]{profile.name}[/] ({reason})")
    with Progress(TextColumn("[bold]verify[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True,
                  disable=as_json) as bar:
        task = bar.add_task("", total=len(verify_mod.correctness_cases(profile)))
        report = verify_mod.run_verify(profile, expect_kernel,
                                       on_progress=lambda case: bar.update(task, advance=1, description=case.name))
    print_json(report) if as_json else verify_report.render(report, console)
    sys.exit(0 if report["ok"] else 1)


@cli.command()
@click.option("--profile", "profile_name", metavar="NAME|PATH",
              help="Starting profile: family, arch and starting tiles (default: this GPU's match).")
@click.option("--hdims", callback=_int_list, help="Comma-separated head dims (default: the profile's).")
@click.option("--causal/--no-causal", default=None, help="Only causal / only non-causal (default both).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--max-candidates", type=click.IntRange(min=1), help="Per (hdim, causal); starting tiles always kept.")
@click.option("--tiles", "shapes", callback=_tile_shapes, metavar="MxN,...",
              help="Only these block_m x block_n shapes (every stage and warp count of the search grid, and "
              "on sm90 each with the pingpong on and off), besides the starting tiles; e.g. --tiles 128x128,128x176.")
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
@click.option("--cache", "cache_path", metavar="FILE.jsonl", help="Resumable results cache "
              "(default: under the flashtune cache dir, per GPU and profile).")
@click.option("--name", help="Name of the written profile (default: <profile>-tuned).")
@click.option("--out", metavar="FILE.yaml", help="Where to write it (default: ./<name>.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
def tune(profile_name, hdims, causal, dtype, max_candidates, shapes, time_budget, max_spill_bytes, repeats,
         final_round, jobs, gpus, fp8, cache_path, name, out, as_json) -> None:
    """Search tile configs on this GPU and write a tuned profile YAML.

    Candidates (restricted by the arch's limits, starting tiles included) are compiled in
    parallel, checked against the fp32 reference, then timed per seqlen bucket (512, 1k, 4k and 16k
    stand for [0, 1k), [1k, 2k), [2k, 8k) and [8k, inf), split further at the profile's own edges); each bucket's
    fastest few and the starting tile are timed again side by side, which decides. Failures
    are recorded with their reason and never retried; an interrupted tune resumes. Example:

    \b
        flashtune tune --profile h200-sm80 --hdims 128 --out profiles/h200-sm80.yaml

    Exit codes: 0 written, 1 nothing could be measured, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    from flashtune import tune as tune_mod, tune_command, tune_space

    gpus_seen = _require_gpu("tune")
    if gpus > len(gpus_seen):
        raise click.BadParameter(f"{gpus} GPUs asked for, {len(gpus_seen)} visible", param_hint="--gpus")
    profile, _ = build_command.resolve_profile(profile_name)
    from flashtune import ops
    from flashtune.toolchain import check_build_toolchain

    ops._check_runs_on(profile, gpus_seen[0])  # sm_89 SASS on an H200 would fail every launch
    check_build_toolchain(profile.arch)  # before anything is compiled or cached
    if fp8 and not (profile.fp8_qk and profile.arch.fp8):
        raise click.BadParameter(f"profile {profile.name} has no FP8 kernels (fp8: {profile.fp8}); "
                                 "tune a profile with fp8: {qk: e4m3}", param_hint="--fp8")
    bad = sorted(set(hdims or ()) - set(profile.head_dims))
    if bad:
        raise click.BadParameter(f"{bad} not in profile {profile.name} (head dims {profile.head_dims})",
                                 param_hint="--hdims")
    for shape in shapes or ():  # a shape that runs at none of the head dims is a typo or a wrong idea
        problems = {h: tune_space.shape_problems(profile.family, h, shape, profile.arch, fp8)
                    for h in hdims or profile.head_dims}
        said = "; ".join(f"hdim {h}: {', '.join(p)}" for h, p in problems.items() if p)
        if all(problems.values()):
            raise click.BadParameter(f"{shape[0]}x{shape[1]} cannot run on {profile.arch.name}: {said}",
                                     param_hint="--tiles")
        if said:  # fine elsewhere: say where it is not tried
            click.secho(f"note: --tiles {shape[0]}x{shape[1]} is not tried at {said}", fg="yellow", err=True)
    opts = tune_mod.TuneOptions(hdims=tuple(hdims or profile.head_dims),
                                causal=(False, True) if causal is None else (causal,), dtype=dtype,
                                max_candidates=max_candidates, shapes=tuple(shapes or ()),
                                time_budget_s=time_budget,
                                max_spill_bytes=max_spill_bytes, repeats=repeats, final_round=final_round,
                                jobs=jobs, gpus=gpus, fp8=fp8)
    console = Console(stderr=True) if as_json else make_console()
    with Progress(TextColumn("[bold]tune[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task("", total=1)

        def on_event(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1), description=stage)

        result = tune_mod.run_tune(profile, gpus_seen[0].name, opts, cache_path, on_event)
    if not result.winners:
        tune_command.render(result, console)
        raise CliError("no candidate could be measured; nothing written", 1)
    name = name or f"{profile.name}-tuned"
    written, prov = tune_command.write_tuned(profile, result, opts, gpus_seen[0].name, name, out or f"{name}.yaml")
    if as_json:
        print_json({"profile": str(written.path), "provenance": prov,
                    "records": [{**r, "tile": r["tile"].label} for r in result.records]})
    else:
        tune_command.render(result, console)
        console.print(f"wrote [bold]{written.path}[/] (profile {written.name}; validated)")


@cli.command()
@click.option("--model", "model_name", metavar="NAME|CONFIG.json",
              help="A built-in shape (llama3-8b-like, llama3-70b-like, qwen2-7b-like, mistral-7b-like) or a "
                   "transformers config.json. Without it, give --layers --heads --hdim.")
@click.option("--layers", type=click.IntRange(min=1))
@click.option("--heads", type=click.IntRange(min=1))
@click.option("--kv-heads", type=click.IntRange(min=1), help="Default: --heads (no GQA).")
@click.option("--hdim", type=click.IntRange(min=1))
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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def memory(model_name, layers, heads, kv_heads, hdim, hidden, intermediate, vocab, batch, seqlen, dtype, kv_dtype,
           gpu_memory, as_json) -> None:
    """What a model needs in GPU memory, and what a flash kernel changes.

    Three accounts: weights (fixed), the KV cache (linear in batch x seqlen) and the attention
    score matrix that a non-flash kernel materialises (quadratic in seqlen, one layer at a
    time), plus one layer's activations; then a verdict against the GPU and what helps.

    \b
        flashtune memory --model llama3-8b-like --batch 4 --seqlen 32768
        flashtune memory --layers 32 --heads 32 --kv-heads 8 --hdim 128 --seqlen 131072 --gpu-memory 24
    """
    from flashtune import memory as mem, memory_report

    assumed: list[str] = []
    if model_name:
        model = mem.with_overrides(mem.find_model(model_name), layers=layers, heads=heads, kv_heads=kv_heads,
                                   head_dim=hdim, hidden=hidden, intermediate=intermediate, vocab=vocab)
    elif layers and heads and hdim:
        model, assumed = mem.custom_model(layers, heads, kv_heads, hdim, hidden, intermediate, vocab)
    else:
        raise click.UsageError("give --model, or --layers, --heads and --hdim")
    if gpu_memory is not None:
        gpu_bytes = int(gpu_memory * 2**30)
    else:
        gpus = detect_gpus()
        gpu_bytes = gpus[0].memory_bytes if gpus else None
    rep = {**mem.report(model, batch, seqlen, gpu_bytes, dtype, kv_dtype), "assumed": assumed}
    print_json(rep) if as_json else memory_report.render(rep, make_console())


@cli.command()
@click.option("--profile", "profile_name", metavar="NAME|PATH", help="Profile for the flashtune backend.")
@click.option("--seqlens", callback=_int_list, help="Comma-separated, default 512,...,16384.")
@click.option("--hdims", callback=_int_list, help="Comma-separated, default 64,128,256.")
@click.option("--batch", type=click.IntRange(min=1), help="Default 16384 // seqlen.")
@click.option("--heads", type=click.IntRange(min=1), help="Default 2048 // hdim.")
@click.option("--heads-kv", type=click.IntRange(min=1), help="K/V heads for GQA/MQA (default = heads).")
@click.option("--causal/--no-causal", default=None, help="Only causal / only non-causal (default both).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--backends", default=",".join(DEFAULT_BACKENDS), show_default=True,
              help="Comma-separated; absent ones show as such.")
@click.option("--repeats", type=click.IntRange(min=3), default=30, show_default=True,
              help="Timed runs per row, in 3 rounds interleaved with the other backends (median reported).")
@click.option("--json", "json_path", metavar="FILE", help="Write the result as JSON ('-' for stdout).")
@click.option("--csv", "csv_path", metavar="FILE", help="Write the rows as CSV ('-' for stdout).")
@click.option("--plot", "plot_path", metavar="FILE.png",
              help="TFLOPS vs seqlen plot; with --model: TTFT, decode tok/s and memory (needs the plot extra).")
@click.option("--model", "model_name", metavar="NAME|CONFIG.json",
              help="Model-level A/B instead of the kernel grid: a built-in shape (see `flashtune memory "
                   "--help`) or a config.json, random weights. Backends: flashtune, flashtune+sdpa-decode "
                   "(decode steps through SDPA, by name), sdpa-*, eager.")
@click.option("--layers", type=click.IntRange(min=1), help="With --model: fewer layers, to fit.")
@click.option("--prefill", callback=_int_list, help="With --model: prompt lengths (default 1024,4096,16384).")
@click.option("--decode-steps", type=click.IntRange(min=2), default=128, show_default=True,
              help="With --model: greedy tokens generated with the KV cache.")
def bench(profile_name, seqlens, hdims, batch, heads, heads_kv, causal, dtype, backends, repeats,
          json_path, csv_path, plot_path, model_name, layers, prefill, decode_steps) -> None:
    """Side-by-side A/B: flashtune against every attention backend present.

    Same shapes and inputs in one process, only the backend switched; median of CUDA-event
    GPU times (calls queued behind a spin kernel, so launch overhead is not in them), TFLOPS,
    peak memory, error against fp32, and the kernel that ran. Example:

    \b
        flashtune bench --hdims 128 --seqlens 1024,4096 --json out.json --plot out.png

    Exit codes: 0 done, 2 bad input, 3 no GPU visible, 130 interrupted.
    """
    from flashtune import bench as bench_mod, bench_report

    _require_gpu("bench")
    if profile_name:
        from flashtune import ops

        ops.use_profile(profile_name)
    if model_name:
        _bench_model(model_name, layers, prefill, decode_steps, batch, dtype, backends, json_path, plot_path)
        return
    names = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}; known: {', '.join(BACKENDS)}", param_hint="--backends")
    shapes = bench_mod.fa_grid(seqlens or bench_mod.SEQLENS, hdims or bench_mod.HDIMS,
                               (False, True) if causal is None else (causal,), dtype, batch, heads, heads_kv)
    console = make_console() if json_path != "-" and csv_path != "-" else Console(stderr=True)
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task("", total=len(shapes))
        result = bench_mod.run_bench(shapes, names, repeats, on_shape=lambda shape, rows: bar.update(
            task, advance=1, description=f"hdim {shape.hdim} causal={shape.causal} seqlen {shape.seqlen_q}"))
    bench_report.render(result, console)
    if json_path:
        _write(json_path, json.dumps(result, indent=1))
    if csv_path:
        _write(csv_path, bench_report.to_csv(result["rows"]))
    if plot_path:
        bench_report.plot(result, plot_path)


def _bench_model(model_name, layers, prefill, decode_steps, batch, dtype, backends, json_path, plot_path) -> None:
    from flashtune import bench_report, model_bench

    if backends == ",".join(DEFAULT_BACKENDS):
        backends = "flashtune,sdpa-flash,sdpa-cudnn,sdpa-math,eager"
    names = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = sorted(set(names) - set(model_bench.MODEL_BACKENDS))
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}; with --model: {', '.join(model_bench.MODEL_BACKENDS)}",
                                 param_hint="--backends")
    result = model_bench.run_model_bench(model_name, names, prefill or [1024, 4096, 16384], batch=batch or 1,
                                         decode_steps=decode_steps, layers=layers, dtype=dtype)
    bench_report.render_model(result, make_console())
    if json_path:
        _write(json_path, json.dumps(result, indent=1))
    if plot_path:
        bench_report.plot_model(result, plot_path)


def _write(path: str, text: str) -> None:
    if path == "-":
        click.echo(text)
    else:
        with open(path, "w") as f:
            f.write(text)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
