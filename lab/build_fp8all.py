"""Build lab/profiles/h100-fp8all.yaml's all-FP8 kernels in parallel (a short visit's first step, so that
what follows does not JIT them one by one).

    PYTHONPATH=. python3 lab/build_fp8all.py
"""
from flashtune.kernels.build import build_binding, build_specs
from flashtune.kernels.profiles import load_profile
from flashtune.kernels.spec import specs_for_profile

build_binding()
results, _ = build_specs([s for s in specs_for_profile(load_profile("lab/profiles/h100-fp8all.yaml"),
                                                        dtypes=["bfloat16"]) if s.fp8_pv])
for r in results:
    print(r.name, "registers", r.registers, "spills", r.spill_stores)
