"""gluon_gemm.sk_items (the host's model of the stream-K walk, which tools/dev/nvfp4_rs_sk_trace labels its time
line with and the reduction's emulation uses) must agree with the kernels' owner formula; and TRACE must compile into
the RS-SK kernel's stamps (on the CPU, sm_90)."""
import random

from sm90 import run_compiled

from atlas.plugins_trt.quant_linear import gluon_gemm as gm


def test_walk_covers_every_pair_once_and_matches_the_kernels_owners():
    rng = random.Random(0)
    for _ in range(300):
        tiles, NP, G = rng.randint(1, 200), rng.randint(1, 70), rng.randint(1, 140)
        DP = rng.choice([0, (tiles // G) * G, max(0, tiles // G - 1) * G])
        seen = {}
        for pid, items in enumerate(gm.sk_items(G, DP, tiles, NP)):
            for u, p0, p1 in items:
                assert 0 <= p0 < p1 <= NP
                for p in range(p0, p1):
                    assert (u, p) not in seen
                    seen[(u, p)] = pid
        assert len(seen) == tiles * NP
        T = (tiles - DP) * NP
        Gs = max(min(G, T), 1)
        for u in range(tiles - DP):  # sk_reduce_kernel / sk_fixup find a tile's programs by this formula
            assert gm.sk_owners.fn(u, NP, T, Gs) == (seen[(DP + u, 0)], seen[(DP + u, NP - 1)])
        # FIX 2 (sk_finish_own): a shared tile's owner, c_first, waits for c_last - c_first parts, one from each later
        # program; no program has two items that start inside a tile (its slot 0 holds one part only)
        items = gm.sk_items(G, DP, tiles, NP)
        for u in range(tiles - DP):
            c_first, c_last = gm.sk_owners.fn(u, NP, T, Gs)
            others = [c for c in range(G) for it in items[c] if it[0] == DP + u and it[1] > 0]
            assert others == list(range(c_first + 1, c_last + 1))
        assert all(sum(it[1] > 0 for it in its) <= 1 for its in items)


def test_trace_compiles_to_clock_stamps():
    out = run_compiled(r"""
from atlas.plugins_trt.quant_linear import gluon_ws as W
from atlas.plugins_trt.quant_linear import triton_gemm as GM
from atlas.plugins_trt.quant_linear import triton_gemv as GV
base = {k: v for k, v in GM.CONFIGS_nvfp4_ws_rs_sk[0].items() if k != "SK_PER_SM"}
for trace in (0, 1):
    ptx = GV.compile_aot(W.signature_nvfp4_gemm_rs_sk({**base, "SK": 132, "DP": 0, "TILED": True, "BITS": True,
                                                       "FIX": 2, "TRACE": bool(trace)}, 6144, 4096)).asm["ptx"]
    print("STAMPS", trace, ptx.count("%globaltimer"), ptx.count("%clock64"))
""")
    rows = {r[1]: (int(r[2]), int(r[3])) for r in (line.split() for line in out.splitlines()) if r[:1] == ["STAMPS"]}
    assert rows["0"] == (0, 0) and rows["1"] == (2, 6), rows
