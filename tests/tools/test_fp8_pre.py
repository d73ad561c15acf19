"""tools/dev/fp8_pre.py's variant list (the GPU sweep itself runs on the GPU box: gpu_check.sh fp8pre)."""

from atlas.plugins_trt.quant_linear import triton_gemv as GV
from atlas.tools.dev.fp8_pre import configs


def test_variants_are_the_shipped_config_with_pre_then_distinct_tiles():
    shipped = {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 1, "TC": False}
    labelled = configs(shipped, 1)
    assert [lab for lab, _ in labelled[:3]] == ["shipped", "shipped pre1", "shipped pre2"]
    assert [c.get("PRE", 0) for _, c in labelled[:3]] == [0, 1, 2]
    rest = [c for _, c in labelled[3:]]
    assert rest and all(c["BLOCK_M"] == 1 and not c["TC"] for c in rest)
    assert not any(all(c.get(k) == v for k, v in shipped.items()) for c in rest)  # the shipped tile once only
    sixteen = [c for _, c in configs({**shipped, "BLOCK_M": 16, "TC": True, "BLOCK_K": 128, "num_stages": 3}, 16)]
    assert all(c["BLOCK_M"] == 16 and c["TC"] for c in sixteen)
    for c in rest + sixteen:  # every variant reaches the kernel's PRE constexpr as the build would pass it
        assert GV._gemv_constexprs(c, False, False, pdl=True).get("PRE", 0) == c.get("PRE", 0)


def test_pre_candidates_are_split_and_within_the_kernel_limit():
    pre = [c for c in GV.CONFIGS_fp8_gemv if c.get("PRE")]
    assert pre and all(c["PRE"] in (1, 2) and c["SPLIT_K"] > 1 and c.get("PIPE", 1) == 1 for c in pre)
    assert {c["BLOCK_M"] for c in pre} == set(GV.M_BUCKETS)
