#!/usr/bin/env python3
"""Benchmark upstream FlashMLA SM90 sparse kernels at deepinfer's DeepSeek-V4 shapes.

Uses the module built by build.sh (FLASHMLA_SRC, else the path in /tmp/flashmla/BUILD_OK) and
FlashMLA's own tests/quant.py for the MODEL1 FP8 KV-cache format. Prints one JSON line per case.

Timing (CUDA events around CUDA-graph replays):
  us      : L2 flushed -- per iteration a 512 MiB memset, then events around one replay of a
            graph holding one op call (split-KV + combine for decode); median over iterations.
            Closest to FlashMLA's own test (kineto, 8 GB memset between runs).
  us_hot  : L2 warm -- one graph with REPS back-to-back op calls, total / REPS (mean).
  us_kineto: FlashMLA's own method -- CUDA profiler, eager calls after an L2 flush, first target
            kernel start to last target kernel end (split-KV + combine), median.
  The decode sched-meta kernel is NOT timed: it runs once in the warm-up call, and the
  FlashMLASchedMeta is then reused (as a real decode step reuses it across layers).
FLOPs = 2 * h_q * (d_qk 512 + d_v 512) * attended keys, summed over query tokens
(decode: keys = topk + extra_topk, all valid; prefill: keys = topk, or topk_length when given).
bytes (decode, approx) = distinct KV tokens read * 584 B + q bf16 + out bf16.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback


def _src_dir():
    src = os.environ.get("FLASHMLA_SRC")
    if not src:
        marker = os.path.join(os.environ.get("FLASHMLA_WORK", "/tmp/flashmla"), "BUILD_OK")
        if os.path.isfile(marker):
            with open(marker) as f:
                src = f.read().strip()
    if not src or not os.path.isdir(src):
        sys.exit("bench.py: FlashMLA build not found (run build.sh or set FLASHMLA_SRC)")
    return src


SRC = _src_dir()
sys.path.insert(0, os.path.join(SRC, "tests"))  # quant.py (needs only torch)
sys.path.insert(0, SRC)

import flash_mla  # noqa: E402
import quant  # noqa: E402  (FlashMLA tests/quant.py)
import torch  # noqa: E402
from reference import compare, ref_decode, ref_prefill  # noqa: E402

D_QK = 512
D_V = 512
MODEL1 = quant.FP8KVCacheLayout.MODEL1_FP8Sparse
MODEL1_BYTES_PER_TOKEN = 448 + 64 * 2 + 7 + 1  # 584, as checked by csrc/api/sparse_decode.h
FLUSH_BYTES = 512 << 20
# Kernel-name substrings timed by the kineto measurement (split-KV decode + combine; prefill).
TARGET_KERNELS = ("splitkv_mla", "mla_combine", "sparse_attn_fwd")

FAILURES = []


def emit(obj):
    print(json.dumps(obj), flush=True)


# ----------------------------------------------------------------------------- timing


class Timer:
    def __init__(self, flush_iters, hot_reps, hot_iters):
        self.flush_iters = flush_iters
        self.hot_reps = hot_reps
        self.hot_iters = hot_iters
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def _graph(self, fn, reps):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        torch.cuda.synchronize()
        return graph

    def measure(self, fn):
        """Returns (us_flushed_median, us_hot_mean, mode)."""
        mode = "cuda-graph"
        try:
            g1 = self._graph(fn, 1)
            ghot = self._graph(fn, self.hot_reps)
            run1, runhot = g1.replay, ghot.replay
            reps = self.hot_reps
        except (
            Exception
        ) as e:  # fall back to eager launches (includes host overhead when GPU idles)
            mode = f"eager (graph capture failed: {type(e).__name__}: {e})"
            torch.cuda.synchronize()
            run1 = fn
            reps = self.hot_reps

            def runhot():
                for _ in range(reps):
                    fn()

        # L2 flushed: the memset keeps the GPU busy while the host enqueues the replay.
        for _ in range(3):
            run1()
        times = []
        for _ in range(self.flush_iters):
            self.flush_buf.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run1()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        flushed = statistics.median(s.elapsed_time(e) * 1e3 for s, e in times)

        runhot()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.hot_iters):
            runhot()
        end.record()
        torch.cuda.synchronize()
        hot = start.elapsed_time(end) * 1e3 / (self.hot_iters * reps)
        return flushed, hot, mode

    def kineto(self, fn, iters=20):
        """FlashMLA-style number: per iteration (after an L2 flush), first target kernel start to
        last target kernel end from the CUDA profiler (eager launches, no graph). Median, us.
        Returns (us or None, note)."""
        try:
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    self.flush_buf.zero_()
                    fn()
                torch.cuda.synchronize()
            evs = sorted(
                (e for e in prof.events() if e.device_type == DeviceType.CUDA),
                key=lambda e: e.time_range.start,
            )
            spans, cur = [], []
            for e in evs + [None]:
                if e is not None and any(t in e.name for t in TARGET_KERNELS):
                    cur.append(e)
                elif cur:
                    spans.append(cur[-1].time_range.end - cur[0].time_range.start)
                    cur = []
            if len(spans) != iters:
                return None, f"kineto: {len(spans)} kernel groups for {iters} iterations"
            return statistics.median(spans), "kineto"
        except Exception as e:
            return None, f"kineto failed: {type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- decode inputs


def distinct_random_indices(rows, n, k, gen_device="cuda"):
    """[rows, k] int32, each row k distinct values in [0, n)."""
    out = torch.empty((rows, k), dtype=torch.int32, device=gen_device)
    chunk = max(1, (1 << 28) // max(n, 1))
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        out[r0:r1] = (
            torch.rand((r1 - r0, n), device=gen_device).topk(k, dim=-1).indices.to(torch.int32)
        )
    return out


class KVScope:
    """One paged MODEL1 FP8 cache (FlashMLA layout) and the physical indices of each query token."""

    def __init__(self, b, s_q, s_kv, block_size, topk, keep_dequant):
        blocks_per_seq = math.ceil(s_kv / block_size)
        num_blocks = b * blocks_per_seq
        block_table = (
            torch.randperm(num_blocks, device="cuda").to(torch.int32).view(b, blocks_per_seq)
        )
        kv = (
            torch.randn((num_blocks, block_size, 1, D_QK), device="cuda", dtype=torch.bfloat16) / 10
        ).clamp_(-1, 1)
        self.kcache = quant.quantize_k_cache(
            kv, MODEL1
        )  # [num_blocks, block_size, 1, 584] fp8 view
        assert self.kcache.shape[-1] == MODEL1_BYTES_PER_TOKEN, self.kcache.shape
        self.dequant = quant.dequantize_k_cache(self.kcache, MODEL1) if keep_dequant else None
        del kv
        abs_idx = distinct_random_indices(b * s_q, s_kv, topk).view(b, s_q, topk)
        blk = abs_idx // block_size
        phys_blk = torch.gather(block_table, 1, blk.view(b, -1).long()).view(b, s_q, topk)
        self.indices = (phys_blk * block_size + abs_idx % block_size).to(torch.int32).contiguous()
        self.block_size = block_size
        self.topk = topk


_SCOPES = {}


def get_scope(b, s_q, s_kv, block_size, topk, tag, keep_dequant=False):
    key = (b, s_q, s_kv, block_size, topk, tag, keep_dequant)
    if key not in _SCOPES:
        if not keep_dequant:
            # keep at most the caches of the current batch shape alive
            for k in [k for k in _SCOPES if k[:2] != (b, s_q)]:
                del _SCOPES[k]
            torch.cuda.empty_cache()
        _SCOPES[key] = KVScope(b, s_q, s_kv, block_size, topk, keep_dequant)
    return _SCOPES[key]


def make_sink(h_q, with_inf):
    sink = torch.randn((h_q,), dtype=torch.float32, device="cuda")
    if with_inf:
        sink[0] = float("inf")
        sink[1] = float("-inf")
    return sink


def decode_call(q, main, extra, sink, sm_scale):
    sched, _ = flash_mla.get_mla_metadata()

    def fn():
        return flash_mla.flash_mla_with_kvcache(
            q,
            main.kcache,
            None,
            None,
            D_V,
            sched,
            None,
            sm_scale,
            False,
            True,
            main.indices,
            sink,
            extra.kcache if extra is not None else None,
            extra.indices if extra is not None else None,
            None,
            None,
        )

    return fn


def check_decode(h_q):
    torch.manual_seed(1)
    b, s_q, s_kv = 4, 2, 2048
    q = torch.randn((b, s_q, h_q, D_QK), device="cuda", dtype=torch.bfloat16).clamp_(-1, 1)
    main = KVScope(b, s_q, s_kv, 256, 128, keep_dequant=True)
    extra = KVScope(b, s_q, s_kv, 64, 512, keep_dequant=True)
    sink = make_sink(h_q, with_inf=True)
    sm_scale = D_QK**-0.5
    out, lse = decode_call(q, main, extra, sink, sm_scale)()
    torch.cuda.synchronize()
    ref_out, ref_lse = ref_decode(q, main, extra, sink, sm_scale)
    ok1, m1 = compare("out", out, ref_out, atol=2e-3, rtol=2.01 / 128, min_cos=0.99999)
    ok2, m2 = compare("lse", lse, ref_lse, atol=1e-4, rtol=1e-4, min_cos=0.99999)
    ok = ok1 and ok2
    emit(
        {
            "check": "decode_model1_fp8",
            "h_q": h_q,
            "b": b,
            "s_q": s_q,
            "topk": 128,
            "extra_topk": 512,
            "pass": ok,
            **m1,
            **m2,
        }
    )
    return ok


def check_prefill(h_q, with_topk_length):
    torch.manual_seed(2)
    s_q, s_kv, topk = 256, 4096, 640
    q = torch.randn((s_q, h_q, D_QK), device="cuda", dtype=torch.bfloat16) / 10
    kv = torch.randn((s_kv, 1, D_QK), device="cuda", dtype=torch.bfloat16) / 10
    indices = distinct_random_indices(s_q, s_kv, topk).view(s_q, 1, topk)
    indices[::7, 0, -5:] = -1  # some invalid entries, as upstream tests do
    sink = make_sink(h_q, with_inf=True)
    topk_length = (
        torch.randint(1, topk + 1, (s_q,), device="cuda", dtype=torch.int32)
        if with_topk_length
        else None
    )
    sm_scale = D_QK**-0.5
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(
        q, kv, indices, sm_scale, D_V, sink, topk_length
    )
    torch.cuda.synchronize()
    r_out, r_max, r_lse = ref_prefill(q, kv, indices, sm_scale, sink, topk_length)
    ok1, m1 = compare("out", out, r_out, atol=8e-4, rtol=3.01 / 128, min_cos=0.99999)
    ok2, m2 = compare("max_logits", max_logits, r_max, atol=1e-5, rtol=1e-4, min_cos=0.99999)
    ok3, m3 = compare("lse", lse, r_lse, atol=1e-4, rtol=1e-4, min_cos=0.99999)
    ok = ok1 and ok2 and ok3
    emit(
        {
            "check": "prefill_bf16",
            "h_q": h_q,
            "s_q": s_q,
            "s_kv": s_kv,
            "topk": topk,
            "topk_length": with_topk_length,
            "pass": ok,
            **m1,
            **m2,
            **m3,
        }
    )
    return ok


# ----------------------------------------------------------------------------- cases


def bench_decode(timer, h_q, b, s_q, topk, extra_topk, s_kv, block_size, extra_block_size):
    torch.manual_seed(3)
    main = get_scope(b, s_q, s_kv, block_size, topk, "main")
    extra = get_scope(b, s_q, s_kv, extra_block_size, extra_topk, "extra")
    q = torch.randn((b, s_q, h_q, D_QK), device="cuda", dtype=torch.bfloat16).clamp_(-1, 1)
    sink = make_sink(h_q, with_inf=False)
    fn = decode_call(q, main, extra, sink, D_QK**-0.5)
    fn()  # builds the sched meta (not timed)
    torch.cuda.synchronize()
    us, us_hot, mode = timer.measure(fn)
    us_k, k_note = timer.kineto(fn)
    keys = topk + extra_topk
    flops = 2 * h_q * (D_QK + D_V) * keys * b * s_q
    distinct_tokens = sum(int(torch.unique(sc.indices).numel()) for sc in (main, extra))
    nbytes = distinct_tokens * MODEL1_BYTES_PER_TOKEN + b * s_q * h_q * (D_QK + D_V) * 2
    emit(
        {
            "kind": "decode_sparse_fp8_model1",
            "h_q": h_q,
            "d_qk": D_QK,
            "d_v": D_V,
            "b": b,
            "s_q": s_q,
            "s_kv": s_kv,
            "topk": topk,
            "extra_topk": extra_topk,
            "block_size": block_size,
            "extra_block_size": extra_block_size,
            "attn_sink": True,
            "us": round(us, 2),
            "tflops": round(flops / us / 1e6, 2),
            "us_hot": round(us_hot, 2),
            "tflops_hot": round(flops / us_hot / 1e6, 2),
            "gbps": round(nbytes / us / 1e3, 1),
            "flops": flops,
            "timing": mode,
            "us_kineto": None if us_k is None else round(us_k, 2),
            "kineto_note": k_note,
        }
    )


def bench_prefill(timer, h_q, s_q, s_kv, topk, with_topk_length):
    torch.manual_seed(4)
    q = torch.randn((s_q, h_q, D_QK), device="cuda", dtype=torch.bfloat16) / 10
    kv = torch.randn((s_kv, 1, D_QK), device="cuda", dtype=torch.bfloat16) / 10
    indices = distinct_random_indices(s_q, s_kv, topk).view(s_q, 1, topk)
    sink = make_sink(h_q, with_inf=False)
    topk_length = (
        torch.full((s_q,), topk, device="cuda", dtype=torch.int32) if with_topk_length else None
    )
    sm_scale = D_QK**-0.5

    def fn():
        return flash_mla.flash_mla_sparse_fwd(q, kv, indices, sm_scale, D_V, sink, topk_length)

    fn()
    torch.cuda.synchronize()
    us, us_hot, mode = timer.measure(fn)
    us_k, k_note = timer.kineto(fn, iters=10)
    flops = 2 * h_q * (D_QK + D_V) * topk * s_q
    emit(
        {
            "kind": "prefill_sparse_bf16",
            "h_q": h_q,
            "d_qk": D_QK,
            "d_v": D_V,
            "s_q": s_q,
            "s_kv": s_kv,
            "topk": topk,
            "topk_length": with_topk_length,
            "attn_sink": True,
            "us": round(us, 2),
            "tflops": round(flops / us / 1e6, 2),
            "us_hot": round(us_hot, 2),
            "tflops_hot": round(flops / us_hot / 1e6, 2),
            "flops": flops,
            "timing": mode,
            "us_kineto": None if us_k is None else round(us_k, 2),
            "kineto_note": k_note,
        }
    )


def run_case(label, fn, *args):
    t0 = time.time()
    try:
        fn(*args)
    except Exception as e:
        FAILURES.append(label)
        emit(
            {
                "case": label,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()[-1500:],
            }
        )
    finally:
        print(f"# {label}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=["all", "decode", "prefill", "check"], default="all")
    ap.add_argument(
        "--block-size",
        type=int,
        default=256,
        help="main (window) cache page size (upstream MODEL1 config: 256)",
    )
    ap.add_argument(
        "--extra-block-size",
        type=int,
        default=64,
        help="extra cache page size (upstream MODEL1 config: 64)",
    )
    ap.add_argument("--flush-iters", type=int, default=30)
    ap.add_argument("--hot-reps", type=int, default=20, help="op calls per hot graph")
    ap.add_argument("--hot-iters", type=int, default=5)
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()

    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    emit(
        {
            "env": {
                "gpu": props.name,
                "sm": f"{props.major}.{props.minor}",
                "num_sms": props.multi_processor_count,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "flashmla_src": SRC,
                "timing": "CUDA events around CUDA-graph replays; "
                "us = L2 flushed (512 MiB memset) median, "
                "us_hot = back-to-back mean; FLOPs = 2*h_q*(512+512)*keys per query token",
            }
        }
    )
    if (props.major, props.minor) != (9, 0):
        sys.exit(f"bench.py: needs an SM90 GPU, got sm_{props.major}{props.minor}")

    timer = Timer(args.flush_iters, args.hot_reps, args.hot_iters)
    checks_ok = True
    if not args.no_check and args.only in ("all", "check"):
        for label, fn, a in [
            ("check decode h64", check_decode, (64,)),
            ("check decode h128", check_decode, (128,)),
            ("check prefill h64", check_prefill, (64, False)),
            ("check prefill h64 topk_length", check_prefill, (64, True)),
            ("check prefill h128", check_prefill, (128, False)),
        ]:
            try:
                checks_ok &= fn(*a)
            except Exception as e:
                checks_ok = False
                emit(
                    {
                        "check": label,
                        "pass": False,
                        "error": f"{type(e).__name__}: {e}",
                        "trace": traceback.format_exc()[-1500:],
                    }
                )
        _SCOPES.clear()
        torch.cuda.empty_cache()

    if args.only in ("all", "decode"):
        s_kv = 16384
        # batch shape outermost: the generated caches serve the three head / top-k configs
        for b, s_q in [(1, 1), (64, 1), (256, 1), (256, 2)]:
            for h_q, extra_topk in [(64, 512), (64, 1024), (128, 512)]:
                run_case(
                    f"decode h{h_q} b{b} s_q{s_q} topk 128+{extra_topk}",
                    bench_decode,
                    timer,
                    h_q,
                    b,
                    s_q,
                    128,
                    extra_topk,
                    s_kv,
                    args.block_size,
                    args.extra_block_size,
                )
        _SCOPES.clear()
        torch.cuda.empty_cache()

    if args.only in ("all", "prefill"):
        for h_q, s_q, with_len in [
            (64, 4096, False),
            (64, 4096, True),
            (64, 16384, False),
            (128, 4096, False),
            (128, 16384, False),
        ]:
            run_case(
                f"prefill h{h_q} s_q{s_q} topk640 len={with_len}",
                bench_prefill,
                timer,
                h_q,
                s_q,
                32768,
                640,
                with_len,
            )
            torch.cuda.empty_cache()

    emit({"summary": {"checks_pass": checks_ok, "failed_cases": FAILURES}})
    if not checks_ok or FAILURES:
        sys.exit(1)


if __name__ == "__main__":
    main()
