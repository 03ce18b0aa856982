"""Runs one `torch.utils.cpp_extension.load` in a child process.

build.py starts this as `python -m flashtune.kernels.build_worker REQUEST.json` with stdout and
stderr going to the build's log file, so ninja's and ptxas' output (registers, spills) is
kept without touching the parent's file descriptors, and parallel builds stay independent.
"""
from __future__ import annotations

import json
import os
import sys


def main(request_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    # cpp_extension reads these at import time / build time: set them first.
    os.environ["CUDA_HOME"] = req["cuda_home"]
    os.environ["TORCH_CUDA_ARCH_LIST"] = req["torch_arch_list"]
    os.environ["MAX_JOBS"] = str(req.get("max_jobs", 1))
    os.environ["PATH"] = os.path.join(req["cuda_home"], "bin") + os.pathsep + os.environ.get("PATH", "")

    from torch.utils import cpp_extension

    cpp_extension.load(
        name=req["name"],
        sources=req["sources"],
        extra_cflags=["-O2"],  # torch picks the C++ standard its headers need
        extra_cuda_cflags=req.get("cuda_flags", []),
        extra_include_paths=req["include_paths"],
        build_directory=req["build_dir"],
        with_cuda=True,
        is_python_module=False,
        is_standalone=False,
        verbose=True,  # stdout is the log file: ptxas -v lines land there
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
