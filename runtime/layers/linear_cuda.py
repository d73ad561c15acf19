"""Linear layer on the GPU: the engine's precompiled NVFP4 / FP8 kernels, dispatched by M bucket; cuBLAS for BF16.

Nothing is compiled here: the kernels come from the engine's kernels/ folder through KernelTable,
and the choice per M was made at build (manifest["linear_kernels"], see build_engine/linear_kernels.py).
An NVFP4 weight whose plan was built for the tiled order ("TILED" in every bucket's config; "BITS": each word's bits in
layout.NVFP4_BITS order too) is re-ordered once here (plugins_trt/quant_linear/layout.py); the engine file keeps the
row-major order. One whose plan says "pad_n" (N off the 128-row tiles) is first padded with zero rows to that many:
its kernels compute pad_n columns, and the layer returns the first N as a view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atlas.plugins_trt.rms_norm.deferred import DeferredNorm
from atlas.runtime.errors import EngineError
from atlas.runtime.kernels import KernelTable

GEMV_BUCKETS = (1, 2, 4, 8, 16)
GEMM_BUCKETS = (64, 256, 512, 2048)
"""512: a prefill chunk's rows (RunnerOptions.prefill_chunk), which without it took the 2048 bucket's plan: for NVFP4
the dequantization to bf16 + cuBLAS that wins at 2048 rows and writes and reads the whole weight in bf16 again at
512 (2026-12-07). Engines built before it have no 512 entry: CudaLinear takes the buckets its plan has."""


def bucket_for(m: int, buckets: tuple[int, ...] = GEMV_BUCKETS + GEMM_BUCKETS) -> int:
    """The smallest of `buckets` (ascending) that holds m rows; the largest for more."""
    for b in buckets:
        if m <= b:
            return b
    return buckets[-1]


def streamk_partials_shape(config: dict) -> tuple[int, int, int, int]:
    """The fp32 partials of the stream-K GEMV (plugins_trt/quant_linear/gluon_streamk.py): two segments a program,
    [PROGRAMS, 2, BLOCK_N, MP], MP the rows of x its mma covers (8, or 16 for BLOCK_M 16)."""
    return config["PROGRAMS"], 2, config["BLOCK_N"], 8 if config["BLOCK_M"] <= 8 else 16


class CudaLinear:
    """y[M, N] = x[M, K] @ W.T (bf16 in and out), W stored in its engine format on the GPU."""

    def __init__(self, fmt: str, tensors: dict[str, torch.Tensor], kernels: KernelTable | None,
                 plan: dict | None, bias: torch.Tensor | None = None):
        self.fmt = fmt
        self.weight = tensors["weight"]
        self.weight_scale = tensors.get("weight_scale")
        self.weight_scale_2 = tensors.get("weight_scale_2")
        self.bias = bias
        self.kernels = kernels
        self.plan = plan
        self.buckets = tuple(sorted(int(b) for b in plan)) if plan else ()  # an older engine's may lack some
        self.n = self.n_out = self.weight.shape[0]  # n: the columns the kernels compute; n_out: the layer's
        self.k = self.weight.shape[1] * (2 if fmt == "nvfp4" else 1)
        if fmt in ("nvfp4", "fp8") and (kernels is None or not plan):
            raise EngineError(f"no compiled kernels for a {fmt} linear {self.n}x{self.k}; rebuild the engine "
                              f"with atlas-build --device cuda.")
        pad = {e.get("pad_n", self.n) for e in (plan or {}).values()}
        if len(pad) > 1 or (pad and min(pad) < self.n):
            raise EngineError(f"the kernel plan of the {fmt} linear {self.n}x{self.k} pads its rows inconsistently "
                              f"({sorted(pad)}); rebuild the engine with this version of atlas-build.")
        if pad and max(pad) > self.n:
            from atlas.plugins_trt.quant_linear.layout import pad_rows

            self.n = max(pad)
            self.weight, self.weight_scale, self.weight_scale_2, self.bias = (
                None if t is None else pad_rows(t, self.n)
                for t in (self.weight, self.weight_scale, self.weight_scale_2, self.bias))
        tiled = {bool(e["config"].get("TILED")) for e in (plan or {}).values()}
        if len(tiled) > 1:
            raise EngineError(f"the kernel plan of the {fmt} linear {self.n}x{self.k} mixes tiled and row-major "
                              f"weight orders; rebuild the engine with this version of atlas-build.")
        self.tiled = tiled == {True}
        # the stream-K GEMV's tile counters (gluon_streamk: zero before its first launch, zero after each), a bucket
        self.counters = {b: torch.zeros(self.n // e["config"]["BLOCK_N"], dtype=torch.int32, device=self.weight.device)
                         for b, e in (plan or {}).items() if e["config"].get("STREAMK")}
        # the fused-norm WK GEMV's counter (int32 [1], zero before and after each launch; one a layer)
        self.norm_counter = (torch.zeros(1, dtype=torch.int32, device=self.weight.device)
                             if any(e.get("kernel_norm") for e in (plan or {}).values()) else None)
        # the permutation kernels that take the block's k order as idx_ptr: permute_k_kernel, which engines built
        # before permute_k_words_kernel carry
        self.gather_perms = {e["perm"] for e in (plan or {}).values()
                             if e.get("perm") and "idx_ptr" in dict(kernels.params(e["perm"]))}
        bits = {bool(e["config"].get("BITS")) for e in (plan or {}).values()}
        if len(bits) > 1:
            raise EngineError(f"the kernel plan of the {fmt} linear {self.n}x{self.k} mixes the NVFP4_BITS word order "
                              f"with the plain one; rebuild the engine with this version of atlas-build.")
        if self.tiled:
            from atlas.plugins_trt.quant_linear.layout import gpu_order

            self.weight, self.weight_scale = gpu_order(self.weight, self.weight_scale, bits == {True})

    def _launch(self, name: str, **args):
        params = self.kernels.params(name)
        self.kernels.launch(name, None, *(args[p] for p, _ in params))

    def _launch_split(self, entry: dict, out: torch.Tensor, silu: bool = False, norm: tuple | None = None,
                      **args) -> None:
        """A bucket's kernel (a GEMV, or the wgmma GEMM) into out, or with SPLIT_K > 1 into fp32 partials the reduction
        sums (+ bias); silu: the reduction that also applies SiLU-mul (out [M, N / 2]); norm (residual, weight,
        eps): the reduction into the residual stream that also applies the decoder's add + RMSNorm."""
        split = entry["config"].get("SPLIT_K", 1)
        if split == 1:
            self._launch(entry["kernel"], out_ptr=out, **args)
            return
        m, n = out.shape
        part = torch.empty(split, m, self.n, device=out.device, dtype=torch.float32)
        self._launch(entry["kernel"], out_ptr=part, **args)
        if norm is not None:
            residual, weight, eps = norm
            self._launch(entry["reduce_norm"], part_ptr=part, bias_ptr=None, res_ptr=residual, w_ptr=weight,
                         out_ptr=out, M=m, N=n, stride_rm=residual.stride(0), stride_om=n, eps=eps)
            return
        self._launch(entry["reduce_silu" if silu else "reduce"], part_ptr=part, bias_ptr=self.bias, res_ptr=None,
                     out_ptr=out, M=m, N=n, stride_rm=0, stride_om=n)

    def fuses_silu(self, m: int) -> bool:
        """Whether M = m rows end in SiLU-mul fused (a gate_up projection whose plan compiled, for that bucket, a
        split-K reduction with it or a WK GEMV with it: "kernel_silu"; build_engine/linear_kernels.py): then
        self(x, silu=True) = silu(gate) * up."""
        return self._fuses("reduce_silu", m) or self._fused_gemv("kernel_silu", m) is not None

    def fuses_norm(self, m: int) -> bool:
        """Whether M = m rows end in the decoder's add + RMSNorm fused (a residual projection whose plan compiled, for
        that bucket, a split-K reduction into the residual stream with it, or the WK GEMV with it: "kernel_norm"):
        then self(x, norm=(residual, weight, eps)) = rms_norm(residual + x @ W.T), residual updated in place
        (CudaOps.add_rms_norm's result: to the bit from the reduction; from the WK form the residual to the bit and
        the output where its sum of squares rounds alike, gluon_gemv.nvfp4_gemv_wk_norm_kernel)."""
        return self._fuses("reduce_norm", m) or self._fused_gemv("kernel_norm", m) is not None

    def defers_norm(self, m: int) -> bool:
        """Whether M = m rows of this residual projection can leave the decoder's add + RMSNorm to the next projection
        (its WK bucket's "kernel_defer", or its split-K reduction's "reduce_defer": self(x, norm=..., defer=True)
        returns a DeferredNorm; plugins_trt/rms_norm/deferred.py)."""
        return self._fused_gemv("kernel_defer", m) is not None or self._fuses("reduce_defer", m)

    def takes_deferred(self, m: int) -> bool:
        """Whether M = m rows of this projection can read a DeferredNorm: its WK bucket's "kernel_rstd" (and
        "kernel_silu_rstd" beside a "kernel_silu"), or its split-K reduction's "reduce_rstd" (and "reduce_silu_rstd"
        beside a "reduce_silu")."""
        entry = self._gemv_entry(m)
        if entry is None:
            return False
        if entry.get("kernel_rstd"):
            return not entry.get("kernel_silu") or bool(entry.get("kernel_silu_rstd"))
        return self._fuses("reduce_rstd", m) and (not entry.get("reduce_silu") or bool(entry.get("reduce_silu_rstd")))

    def _gemv_entry(self, m: int) -> dict | None:
        """The plan item of a quantized GEMV bucket without bias (where the fused forms may be), else None."""
        if self.fmt not in ("nvfp4", "fp8") or m > GEMV_BUCKETS[-1] or self.bias is not None:
            return None
        return self.plan[str(bucket_for(m, self.buckets))]

    def _fused_gemv(self, kind: str, m: int) -> str | None:
        """The bucket's GEMV kernel that itself ends in SiLU-mul ("kernel_silu": gluon_gemv.nvfp4_gemv_wk_kernel
        SILU) or in the add + RMSNorm ("kernel_norm": nvfp4_gemv_wk_norm_kernel), if the plan has one."""
        entry = self._gemv_entry(m)
        return entry.get(kind) if entry is not None else None

    def _fuses(self, reduction: str, m: int) -> bool:
        entry = self._gemv_entry(m)
        if entry is None:
            return False
        cfg = entry["config"]
        return bool(entry.get(reduction)) and cfg.get("SPLIT_K", 1) > 1 and not cfg.get("STREAMK")

    def _launch_sk(self, entry: dict, x: torch.Tensor, out: torch.Tensor, common: dict) -> None:
        """gluon_gemm.nvfp4_gemm_wgmma_sk_kernel or (WS) gluon_ws.nvfp4_gemm_rs_sk_kernel on x in its k order: whole
        tiles stored, the shared ones summed by the kernel (FIX: counters, zero before and after) or by
        sk_reduce_kernel (launched where there are any)."""
        from atlas.plugins_trt.quant_linear import gluon_gemm as gm

        cfg, m = entry["config"], x.shape[0]
        xp = self._x_operand(entry, x)
        dp = gm.sk_dp_tiles(cfg, m, self.n)
        part = torch.empty(gm.sk_partials_shape(cfg), device=x.device, dtype=torch.float32)
        cnt = gm.sk_counter_buffer(gm.sk_counters(cfg, m, self.n), x.device)
        self._launch(entry["kernel"], x_ptr=xp, out_ptr=out, part_ptr=part, cnt_ptr=cnt, DP=dp,
                     **{**common, "stride_xm": xp.stride(0)})
        if entry.get("reduce") and gm.sk_counters(cfg, m, self.n) > 0:
            self._launch(entry["reduce"], part_ptr=part, ws2_ptr=self.weight_scale_2, bias_ptr=self.bias,
                         res_ptr=None, out_ptr=out, M=m, N=self.n, K=self.k, DP=dp, G=cfg["SK"], stride_rm=0,
                         stride_om=self.n)

    def _x_operand(self, entry: dict, x: torch.Tensor) -> torch.Tensor:
        """x as a wgmma / warp-specialized bucket's kernel reads it: in the decode's k order by the plan's
        permutation kernel (one launch: permute_k_words_kernel, or permute_k_kernel in older engines), as given (NAT,
        XP), or for an engine whose plan names no permutation kernel (built before it) by a torch gather."""
        from atlas.plugins_trt.quant_linear import gluon_gemm as gm
        from atlas.plugins_trt.quant_linear.triton_gemm import permutes_x

        cfg = entry["config"]
        if not permutes_x(cfg):
            return x.contiguous()
        if not entry.get("perm"):
            return gm.gather_k(x, cfg["BLOCK_K"])
        xp = torch.empty_like(x)
        args = dict(x_ptr=x, out_ptr=xp, M=x.shape[0], K=self.k, stride_xm=x.stride(0), stride_om=xp.stride(0))
        if entry["perm"] in self.gather_perms:
            args["idx_ptr"] = gm.block_index(cfg["BLOCK_K"], x.device)
        self._launch(entry["perm"], **args)
        return xp

    def _dequant_linear(self, entry: dict, x: torch.Tensor, out: torch.Tensor) -> None:
        """Large M: the precompiled nvfp4_dequant_kernel writes `rows` weight rows as bf16 into a workspace, cuBLAS
        multiplies them into those output columns; chunk by chunk (triton_gemm.nvfp4_dequant_linear's loop)."""
        from atlas.plugins_trt.quant_linear.triton_gemm import dequant_matmul

        rows = entry["rows"]
        work = torch.empty(rows, self.k, device=x.device, dtype=torch.bfloat16)
        for n0 in range(0, self.n, rows):
            n1 = min(self.n, n0 + rows)
            self._launch(entry["kernel"], w_ptr=self.weight[n0:n1], ws_ptr=self.weight_scale[n0:n1],
                         ws2_ptr=self.weight_scale_2[n0:n1], out_ptr=work, N=n1 - n0, K=self.k,
                         stride_wn=self.weight.stride(0), stride_sn=self.weight_scale.stride(0), stride_on=self.k)
            dequant_matmul(x, work[: n1 - n0], None if self.bias is None else self.bias[n0:n1], None,
                           out[:, n0:n1])

    def __call__(self, x: torch.Tensor | DeferredNorm, silu: bool = False, norm: tuple | None = None,
                 defer: bool = False) -> torch.Tensor | DeferredNorm:
        """x: [M, K] bf16 contiguous, or a DeferredNorm (where takes_deferred(M); else it is normed first) -> [M, N]
        bf16; silu (where fuses_silu(M)): silu(gate) * up, [M, N / 2]; norm (residual, weight, eps) (where
        fuses_norm(M)): the decoder's add + RMSNorm of the projection, with defer (where defers_norm(M)) left to the
        next projection: the residual updated, a DeferredNorm returned."""
        if isinstance(x, DeferredNorm) and not self.takes_deferred(x.shape[0]):
            x = x.materialize()
        if self.fmt in ("bfloat16", "float32"):
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        m = x.shape[0]
        bucket = str(bucket_for(m, self.buckets))
        entry = self.plan[bucket]
        if silu and not self.fuses_silu(m):
            raise ValueError(f"the {self.fmt} linear {self.n}x{self.k} has no fused SiLU-mul at M = {m}")
        if norm is not None and not self.fuses_norm(m):
            raise ValueError(f"the {self.fmt} linear {self.n}x{self.k} has no fused add + RMSNorm at M = {m}")
        if defer and (norm is None or not self.defers_norm(m)):
            raise ValueError(f"the {self.fmt} linear {self.n}x{self.k} cannot defer its add + RMSNorm at M = {m}")
        if isinstance(x, DeferredNorm):  # the GEMV on hw, scaled by the row's rstd (in the WK GEMV or the reduction)
            return self._rstd(entry, x, silu)
        out = torch.empty(m, self.n // 2 if silu else self.n, device=x.device, dtype=torch.bfloat16)
        common = dict(bias_ptr=self.bias, res_ptr=None, M=m, N=self.n, K=self.k, stride_xm=x.stride(0),
                      stride_wn=self.weight.stride(0), stride_rm=0, stride_om=self.n, **self._weights())
        if defer:  # the GEMV into the residual stream, hw and the parts of its sum of squares
            return self._defer(entry, x, out, norm, common)
        if m <= GEMV_BUCKETS[-1] and entry["config"].get("STREAMK"):  # one launch: partials and counters inside
            part = torch.empty(streamk_partials_shape(entry["config"]), device=x.device, dtype=torch.float32)
            self._launch(entry["kernel"], x_ptr=x, out_ptr=out, part_ptr=part, cnt_ptr=self.counters[bucket],
                         **common)
        elif silu and self._fused_gemv("kernel_silu", m):  # one launch: the WK GEMV writes silu(gate) * up
            self._launch(entry["kernel_silu"], x_ptr=x, out_ptr=out, **{**common, "stride_om": self.n // 2})
        elif norm is not None and self._fused_gemv("kernel_norm", m):  # one launch: the WK GEMV, add + RMSNorm
            residual, weight, eps = norm
            self._launch(entry["kernel_norm"], x_ptr=x, out_ptr=out, nw_ptr=weight, cnt_ptr=self.norm_counter,
                         eps=eps, **{**common, "res_ptr": residual, "stride_rm": residual.stride(0)})
        elif m <= GEMV_BUCKETS[-1]:
            self._launch_split(entry, out, silu=silu, norm=norm, x_ptr=x, **common)
        elif self.fmt == "nvfp4" and entry["config"].get("DEQUANT"):
            self._dequant_linear(entry, x, out)
        elif self.fmt == "nvfp4" and entry["config"].get("SK"):  # a persistent GEMM (+ its reduction)
            self._launch_sk(entry, x, out, common)
        elif self.fmt == "nvfp4" and (entry["config"].get("WGMMA") or entry["config"].get("WS")):
            xp = self._x_operand(entry, x)  # the wgmma / warp-specialized GEMM: x in its k order first
            self._launch_split(entry, out, x_ptr=xp, **{**common, "stride_xm": xp.stride(0)})
        elif self.fmt == "nvfp4":
            self._launch(entry["kernel"], x_ptr=x, out_ptr=out, **common)
        else:  # W8A8: quantize activations per row, then the FP8 tensor-core GEMM
            xq = torch.empty(m, self.k, device=x.device, dtype=torch.float8_e4m3fn)
            xs = torch.empty(m, device=x.device, dtype=torch.float32)
            self._launch(entry["quant"], x_ptr=x, xq_ptr=xq, xs_ptr=xs, M=m, K=self.k, stride_xm=x.stride(0),
                         stride_qm=xq.stride(0))
            if entry["config"].get("CUBLAS"):  # cuBLASLt's FP8 GEMM with the row-wise scales
                from atlas.plugins_trt.quant_linear.triton_gemm import scaled_mm_fp8

                scaled_mm_fp8(xq, xs, self.weight, self.weight_scale, self.bias, None, out)
            else:
                self._launch(entry["kernel"], xq_ptr=xq, xs_ptr=xs, out_ptr=out,
                             **{**common, "stride_xm": xq.stride(0)})
        if self.bias is not None and not self._adds_bias(entry):
            out += self.bias  # the build compiles the kernels without a bias epilogue
        return out if self.n == self.n_out else out[:, :self.n_out]  # a padded plan's N columns

    def _rstd(self, entry: dict, x: DeferredNorm, silu: bool) -> torch.Tensor:
        """The bucket's GEMV reading a deferred norm: the WK one scaling by rstd itself ("kernel_rstd", or
        "kernel_silu_rstd" with silu), or the split GEMV on hw then its reduction scaling by rstd ("reduce_rstd",
        "reduce_silu_rstd")."""
        m = x.shape[0]
        width = self.n // 2 if silu else self.n
        out = torch.empty(m, width, device=x.hw.device, dtype=torch.bfloat16)
        rstd = dict(ss_ptr=x.parts, M=m, K=self.k, P=x.parts.shape[1], stride_om=width, eps=x.eps)
        if entry.get("kernel_rstd"):
            self._launch(entry["kernel_silu_rstd" if silu else "kernel_rstd"], x_ptr=x.hw, out_ptr=out, N=self.n,
                         stride_xm=x.hw.stride(0), stride_wn=self.weight.stride(0), **rstd, **self._weights())
        else:
            part = torch.empty(entry["config"]["SPLIT_K"], m, self.n, device=x.hw.device, dtype=torch.float32)
            self._launch(entry["kernel"], x_ptr=x.hw, out_ptr=part, bias_ptr=None, res_ptr=None, N=self.n,
                         stride_xm=x.hw.stride(0), stride_wn=self.weight.stride(0), stride_rm=0,
                         **{**rstd, "stride_om": self.n}, **self._weights())
            self._launch(entry["reduce_silu_rstd" if silu else "reduce_rstd"], part_ptr=part, bias_ptr=self.bias,
                         out_ptr=out, N=width, **rstd)
        return out if self.n == self.n_out or silu else out[:, :self.n_out]

    def _defer(self, entry: dict, x: torch.Tensor, out: torch.Tensor, norm: tuple, common: dict) -> DeferredNorm:
        """The residual projection leaving its norm to the next one: the WK GEMV doing it all ("kernel_defer", one
        part a program), or the split GEMV then its reduction doing it ("reduce_defer", a part a reduction
        program)."""
        residual, weight, eps = norm
        m = x.shape[0]
        if entry.get("kernel_defer"):
            parts = torch.empty(m, self.n // entry["config"]["BLOCK_N"], device=x.device, dtype=torch.float32)
            self._launch(entry["kernel_defer"], x_ptr=x, out_ptr=out, nw_ptr=weight, ss_ptr=parts,
                         **{**common, "res_ptr": residual, "stride_rm": residual.stride(0)})
            return DeferredNorm(out, parts, eps)
        part = torch.empty(entry["config"]["SPLIT_K"], m, self.n, device=x.device, dtype=torch.float32)
        self._launch(entry["kernel"], x_ptr=x, out_ptr=part, **common)
        columns = self.kernels.kernels[entry["reduce_defer"]].entry["constexprs"]["BLOCK_N"]  # a program's
        parts = torch.empty(m, -(-self.n // columns), device=x.device, dtype=torch.float32)
        self._launch(entry["reduce_defer"], part_ptr=part, bias_ptr=None, res_ptr=residual, w_ptr=weight, out_ptr=out,
                     ss_ptr=parts, M=m, N=self.n, stride_rm=residual.stride(0), stride_om=self.n)
        return DeferredNorm(out, parts, eps)

    def _weights(self) -> dict:
        """The weight arguments of this format's kernels."""
        if self.fmt == "nvfp4":
            return dict(w_ptr=self.weight, ws_ptr=self.weight_scale, ws2_ptr=self.weight_scale_2,
                        stride_sn=self.weight_scale.stride(0))
        return dict(w_ptr=self.weight, ws_ptr=self.weight_scale)

    def _adds_bias(self, entry: dict) -> bool:
        """Whether the launches of this M bucket's plan add the bias themselves (cuBLAS ways, or a kernel compiled
        with HAS_BIAS writing the output: the split-K reduction when there is one)."""
        cfg = entry["config"]
        if cfg.get("DEQUANT") or cfg.get("CUBLAS"):
            return True
        last = entry.get("reduce") or entry["kernel"]
        return bool(self.kernels.kernels[last].entry["constexprs"].get("HAS_BIAS"))
