"""Experiment helper (GPU box): the NVFP4 GEMMs of decode's batch-32 bucket launched three ways, in one run.

    python -m atlas.tools.dev.aot_carveout   # $OUT/aot_carveout.json

Why: in the 8B nvfp4 decode step at batch 32 the M-64-bucket wgmma GEMMs ran ~2.3x their benchmark times (gate_up
103.8 us a launch in profile_b32 of tools/results/decode_h100.json, 45.8 us at M 64 in gemm_h100.json). The
benchmark and the build's search launch through Triton, whose launcher gives a kernel of more than 48 KB of shared
memory the cache preference for shared memory (driver.c loadBinary); engines launched the same cubins through
runtime/kernels.KernelTable, which until 2026-12-08 set only the dynamic shared memory limit. This times, for each
benchmark shape's shipped M-64 config (variants.shipped_results) at M 32 and 64:
  * "triton": the config through Triton's launcher (triton_gemm.launch_nvfp4_gemm), as the search timed it;
  * "aot": the same kernels compiled ahead of time (linear_kernels.plan_item, the build's own entry) and launched
    by CudaLinear through KernelTable, as engines launch them now;
  * "aot_no_preference": the same loaded as KernelTable did before (SHARED_PREFERENCE "none": no cache preference,
    the limit at the kernel's own size).
Each checked against the fp32 reference, then timed as CUDA-graph replays over rotated weight copies
(variants.check_and_time). Also each kernel's programs an SM as the driver's occupancy calculator puts them under
both loads.
"""
from __future__ import annotations

MS = (32, 64)


def _loaded(table_dir, table: dict, preference: str):
    """A KernelTable of the compiled kernels, every function loaded under the shared-memory preference
    (runtime/kernels.SHARED_PREFERENCE: "large", the default, or "none", the loading before 2026-12-08)."""
    from atlas.runtime import kernels

    with kernels.shared_preference(preference):
        kt = kernels.KernelTable.load(table_dir, table)
    for kernel in kt.kernels.values():
        kt._function(kernel)
    return kt


def _occupancy(kt) -> dict:
    """{kernel name: programs an SM} by the driver's occupancy calculator."""
    from atlas.runtime.kernels import _check

    cu = kt._cu
    return {name: int(_check(cu, cu.cuOccupancyMaxActiveBlocksPerMultiprocessor, kt._function(k),
                             32 * k.entry["num_warps"], k.entry["shared"]))
            for name, k in kt.kernels.items()}


def main() -> None:
    import json
    import tempfile
    from pathlib import Path

    import torch

    from atlas.build_engine.kernels.aot import compile_kernels, write_kernels
    from atlas.build_engine.linear_kernels import plan_item
    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.runtime.layers.linear_cuda import CudaLinear
    from atlas.tools.dev.nvfp4_streamk import SHAPES
    from atlas.tools.dev.variants import check_and_time, nvfp4_tiled_copies, sweep_start

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    tmp = Path(tempfile.mkdtemp())
    for name, (n, k) in SHAPES.items():
        if "lm_head" in name:  # the step's LM head is cuBLAS's in every engine
            continue
        cfg = shipped[(name, 64)]
        specs, seen = [], set()

        def add(sig, kname, grid, specs=specs, seen=seen):
            if kname not in seen:
                seen.add(kname)
                specs.append(sig.kernel_spec(kname, grid))
            return kname

        item = plan_item("nvfp4", 64, n, k, cfg, add, True)
        table_dir = tmp / name
        table = write_kernels(compile_kernels(specs), table_dir / "kernels")
        tables = {"aot": _loaded(table_dir, table, "large"), "aot_no_preference": _loaded(table_dir, table, "none")}
        occupancy = {form: _occupancy(kt) for form, kt in tables.items()}
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        layers = {}
        for form, kt in tables.items():  # one CudaLinear a weight copy, holding that copy in the GPU order as given
            layers[form] = []
            for w, ws, ws2 in copies:
                layer = CudaLinear("nvfp4", {"weight": w, "weight_scale": ws, "weight_scale_2": ws2}, kt, {"64": item})
                layer.weight, layer.weight_scale = w, ws  # init re-orders a row-major weight; these are tiled
                layers[form].append(layer)
        for m in MS:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

            def run(form, qt, x=x, out=out):
                if form["form"] == "triton":
                    return gemm.launch_nvfp4_gemm(x, *qt, cfg, out=out)
                i = next(j for j, c in enumerate(copies) if c[0] is qt[0])
                return layers[form["form"]][i](x)

            forms = [{"form": f} for f in ("triton", "aot", "aot_no_preference")]
            records, _ = check_and_time(forms, run, x.float() @ ref_w.T, copies)
            row = {"shape": name, "N": n, "K": k, "M": m, "config": cfg, "bytes": nbytes,
                   "programs_an_sm": occupancy, "forms": records}
            res["rows"].append(row)
            print(f"{name:22s} M={m:2d} " + "  ".join(
                f"{r['form']} {r.get('us', float('nan')):7.1f} us" + (f" ({r['error']})" if "error" in r else "")
                for r in records) + f"  programs an SM {occupancy}", flush=True)
            json.dump(res, open(f"{out_dir}/aot_carveout.json", "w"), indent=1)
        copies = ref_w = layers = tables = None  # this shape's memory back before the next one's
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
