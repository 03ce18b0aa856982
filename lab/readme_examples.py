"""Run the README's examples as written, on the device: every indented `flashtune ...` line of
the Commands section, and the Python blocks (with the names they leave to the reader defined).

Usage: python3 lab/readme_examples.py OUTDIR [--only REGEX] [--skip REGEX] [--timeout S] [--python]
Each command runs in OUTDIR/work (so `--out out.json` lands there), its output in OUTDIR/<n>.txt;
a table of exit code, seconds and last line is printed last. `--timeout` stops a command with
SIGINT (what Ctrl-C sends), so a tune that outlasts it exits 130 and says how to resume.
"""
import argparse
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

# Names the README's Python blocks leave to the reader, defined as a user would.
PYTHON_PRELUDE = """
import torch, flashtune
q_packed = torch.randn(3000, 32, 128, device="cuda", dtype=torch.bfloat16)
k_packed = v_packed = torch.randn(3000, 8, 128, device="cuda", dtype=torch.bfloat16)
cu_seqlens_q = cu_seqlens_k = torch.tensor([0, 1000, 3000], device="cuda", dtype=torch.int32)
max_seqlen_q = max_seqlen_k = 2000
"""
FP8_PRELUDE = """
qd = torch.ones(2, 8, device="cuda", dtype=torch.float32)
kd = torch.ones(2, 8, device="cuda", dtype=torch.float32)
"""
KVCACHE_PRELUDE = """
q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k_cache = torch.randn(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)  # 64 pages of 16 tokens
v_cache = torch.randn_like(k_cache)
key_cache, value_cache = k_cache, v_cache
pages = torch.randperm(64, device="cuda").to(torch.int32).view(2, 32)
lens = torch.tensor([100, 5], device="cuda", dtype=torch.int32)
k_new = v_new = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
angles = torch.rand(1024, 64, device="cuda")
cos, sin = angles.cos(), angles.sin()
q_packed = torch.randn(3, 32, 128, device="cuda", dtype=torch.bfloat16)
cu_seqlens_q = torch.tensor([0, 1, 3], device="cuda", dtype=torch.int32)
max_seqlen_q, max_seqlen_k = 2, 512
out_packed = torch.empty_like(q_packed)
"""
HF_PRELUDE = """
import tempfile
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
path = tempfile.mkdtemp()
LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)).save_pretrained(path)
"""
HF_EPILOGUE = """
model = model.cuda()
ids = torch.randint(0, 1000, (1, 300), device="cuda")
out = model.generate(ids, max_new_tokens=8, do_sample=False)
print("generated", tuple(out.shape))
"""


def cli_examples():
    lines = re.findall(r"^    (flashtune [^\n]*)$", README, flags=re.M)
    return [line.split("  #")[0].strip() for line in lines]


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def run(cmd, cwd, log, timeout):
    start = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
    lines = [ln for ln in pathlib.Path(log).read_text().splitlines() if ln.strip()]
    return rc, time.time() - start, (lines[-1] if lines else "")[:110]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--only", default="")
    ap.add_argument("--skip", default="^$")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--timeouts", default="", help="REGEX=S,...: a timeout of its own per example")
    ap.add_argument("--python", action="store_true", help="also the Python blocks")
    args = ap.parse_args()
    out = pathlib.Path(args.outdir)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    # `profiles show ./my-card.yaml`: a user's own profile file, here a copy of a shipped one
    (work / "my-card.yaml").write_text((ROOT / "profiles" / "rtx4090.yaml").read_text())
    rows = []
    for i, example in enumerate(cli_examples()):
        if not re.search(args.only, example) or re.search(args.skip, example):
            continue
        cmd = [sys.executable, "-m"] + shlex.split(example)
        timeout = args.timeout
        for pair in filter(None, args.timeouts.split(",")):
            pattern, seconds = pair.rsplit("=", 1)
            if re.search(pattern, example):
                timeout = float(seconds)
        rows.append((example,) + run(cmd, work, out / f"cli_{i:02d}.txt", timeout))
    if args.python:
        blocks = python_blocks()
        basic = blocks[0]
        kvcache, = (b for b in blocks if "flash_attn_with_kvcache" in b)
        fp8, = (b for b in blocks if "q_descale" in b)
        hf, = (b for b in blocks if "flashtune.hf" in b)
        scripts = {"python-api": PYTHON_PRELUDE + basic,
                   "python-kvcache": PYTHON_PRELUDE + KVCACHE_PRELUDE + kvcache,
                   "python-fp8": PYTHON_PRELUDE + basic + FP8_PRELUDE + fp8,
                   "python-hf": PYTHON_PRELUDE + HF_PRELUDE + hf + HF_EPILOGUE}
        for name, text in scripts.items():
            script = out / f"{name}.py"
            script.write_text(text + "\nprint('ok')\n")
            rows.append((name,) + run([sys.executable, str(script)], work, out / f"{name}.txt", args.timeout))
    print(f"{'rc':>4} {'s':>6}  example | last line")
    for example, rc, secs, last in rows:
        print(f"{rc:>4} {secs:6.1f}  {example} | {last}")


if __name__ == "__main__":
    main()
