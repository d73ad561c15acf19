"""Experiment helper (CPU): what differs between a kernel as the build's search launches it (Triton's JIT and
launcher) and as engines launch it (the build's cubin through runtime/kernels.KernelTable), compiled here for sm_90.

    python -m atlas.tools.dev.launch_differences > tools/results/launch_differences.txt

1. Shared memory: Triton's launcher gives a kernel of more than 48 KB the cache preference for shared memory, which
   KernelTable did not before 2026-12-08 (KernelTable._prefer_shared). Listed: every step and Gated DeltaNet kernel
   of the Llama-3.1-8B and Qwen3.5-27B shapes over 48 KB, and the NVFP4 GEMM configs gemm_h100.json shipped at M 64.
2. Triton's JIT turns an int argument equal to 1 into a constexpr, so the search times bucket-1 GEMVs with M = 1
   folded in, where the cubins take M at run time: the shipped M 1 GEMV configs compiled both ways (instructions and
   registers, tools/dev/sass_mix.opcode_mix).
"""
from __future__ import annotations

import dataclasses
import json

SHAPES = {"llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.gate_up": (28672, 4096), "llama-3.1-8b.down": (4096, 14336),
          "qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408)}
LIMIT = 48 * 1024


def main() -> None:
    from atlas.build_engine.families import family_for
    from atlas.build_engine.gdn_kernels import gdn_kernel_list
    from atlas.build_engine.kernels.aot import compile_kernel, compile_kernels
    from atlas.build_engine.linear_kernels import plan_item
    from atlas.build_engine.step_kernels import compile_step_kernels
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.runtime.model_runner import RunnerOptions
    from atlas.tools.dev.sass_mix import opcode_mix
    from atlas.tools.synthetic import text_config
    from atlas.tools.synthetic_presets import PRESETS

    print("1. kernels over 48 KB of shared memory (bytes, warps, build-time grid)")
    for preset in ("llama-3.1-8b", "qwen3.5-27b"):
        hf = text_config(PRESETS[preset])
        config = family_for(hf).canonical_config(hf, {}, set())
        compiled = compile_step_kernels(config, RunnerOptions(max_batch=32, max_seq_len=4096))[0]
        if preset.startswith("qwen"):
            compiled += gdn_kernel_list(config)[0]
        for c in compiled:
            if c.metadata.shared > LIMIT:
                print(f"   {preset} {c.spec.name}: {c.metadata.shared}, {c.spec.num_warps}, {c.spec.grid}")
    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"]
               for c in json.load(open("tools/results/gemm_h100.json"))["cases"]}
    for name, (n, k) in SHAPES.items():
        specs = []
        plan_item("nvfp4", 64, n, k, shipped[(name, 64)], lambda sig, kname, grid: specs.append(
            sig.kernel_spec(kname, grid)) or kname, True)
        for c in compile_kernels(specs):
            print(f"   {name} M-64 bucket {c.spec.name}: {c.metadata.shared}, {c.spec.num_warps}, {c.spec.grid}"
                  + ("" if c.metadata.shared > LIMIT else " (under 48 KB)"))

    print("2. the shipped M 1 GEMVs with M at run time (the cubins) and M = 1 folded in (Triton's JIT)")
    for name, (n, k) in list(SHAPES.items())[:3]:
        cfg = shipped[(name, 1)]
        spec = gemv.signature_nvfp4_gemv(cfg, n, k, pdl=True).kernel_spec("gemv", gemv.grid_gemv(cfg, n))
        one = dataclasses.replace(spec, signature={**spec.signature, "M": "constexpr"},
                                  constexprs={**spec.constexprs, "M": 1}, grid_formula=None,
                                  divisible_by_16=tuple(p for p in spec.divisible_by_16 if p != "M"))
        for label, s in (("M at run time", spec), ("M = 1", one)):
            mix, usage, _ = opcode_mix(compile_kernel(s).cubin)
            print(f"   {name} {label}: {usage}, {sum(mix.values())} instructions")


if __name__ == "__main__":
    main()
