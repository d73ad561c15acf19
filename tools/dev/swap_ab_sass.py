"""Experiment helper, not used by Atlas: where the swap-AB nvfp4 GEMM (tools/dev/nvfp4_swap_ab.py) races, read off
its sm_90 SASS (compiled on the CPU, no GPU needed).

    python -m atlas.tools.dev.swap_ab_sass > tools/results/swap_ab_sass.txt

For each config: the K loop's address range, the wgmma waits in it, how many wgmma groups may still be in flight when
the loop branches back, and the first instruction of the next iteration (before its first wgmma) that writes a
register an in-flight HGMMA reads as its A fragment (4 registers from the one the HGMMA names). With DRAIN there
should be none in flight.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def sass(cfg: dict, num_warps: int, num_stages: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from atlas.tools.dev import nvfp4_swap_ab as exp

    fn = exp.gemm_w
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16"}
    sig = {n: ("constexpr" if n in cfg else types.get(n, "i32")) for n in fn.arg_names}
    aligned = ("N", "K", "stride_xm", "stride_wn", "stride_sn", "stride_rm", "stride_om")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in aligned}
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cfg, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout


def analyse(text: str) -> str:
    ins = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    back = [(a, int(t, 16)) for a, b in ins for t in re.findall(r"BRA (0x[0-9a-f]+)", b) if int(t, 16) < a]
    loops = [(a, t) for a, t in back if any(t <= x <= a and "HGMMA" in b for x, b in ins)]
    if not loops:
        return "no K loop with wgmma found"
    end, top = max(loops, key=lambda x: x[0] - x[1])
    body = [(a, b) for a, b in ins if top <= a <= end]
    waits = [int(x, 16) for _, b in body for x in re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", b)]
    in_flight = waits[-1] if waits else 0
    groups, current = [], []
    for _, b in body:
        m = re.match(r"HGMMA\S*\s+R\d+, R(\d+),", b)
        if m:
            current.append(int(m.group(1)))
            if "gsb0" in b:
                groups.append(current)
                current = []
    live = {r + i for g in groups[len(groups) - in_flight:] for r in g for i in range(4)} if in_flight else set()
    first = None
    for a, b in body:
        if b.startswith(("HGMMA", "WARPGROUP")):
            break
        op, _, rest = b.partition(" ")
        dst = re.match(r"R(\d+)\b", rest.strip())
        if dst and not op.startswith(("ST", "@")) and int(dst.group(1)) in live:
            first = f"0x{a:04x} {b[:50]}"
            break
    return (f"loop 0x{top:04x}-0x{end:04x}, waits {waits}, {in_flight} groups in flight at the back-edge, "
            f"first overwrite of an in-flight A register: {first}")


def main() -> None:
    base = dict(GROUP_M=8, HAS_BIAS=False, HAS_RESIDUAL=False, SWAP=True)
    for bm, bn, bk, w, s in ((128, 128, 64, 4, 3), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (256, 128, 64, 8, 3)):
        for ptx in (True, False):
            for drain in (False, True):
                cfg = dict(base, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PTX=ptx, DRAIN=drain)
                print(f"BM {bm} BN {bn} BK {bk} {w} warps {s} stages PTX {ptx} DRAIN {drain}: "
                      f"{analyse(sass(cfg, w, s))}", flush=True)


if __name__ == "__main__":
    main()
