"""Speculative decoding through the whole engine on the GPU: V4-Flash widths (a few layers, random
weights in the shipped formats, load_format dummy), greedy, next to speculation off.

    python benchmarks/gpu_engine_spec_bench.py [--layers sliding,csa,hca] [--batches 1,8,64]
        [--spec-zero-overhead both|on|off] [--mtp off|also|only]

For each batch size B: B requests of --prompt random tokens generate --tokens tokens each. Modes:
speculation off with zero-overhead scheduling (the default engine), speculation off without it
(what drafting costs in scheduling alone), and an oracle drafter fed the plain run's greedy
continuation with k drafts per step that are always right, right with probability 0.8 and 0.5 per
position (independent), and always wrong, each with zero-overhead scheduling on (a sequence whose
verify row is in flight skips the next step, cpp/src/engine/README.md) and off (--spec-zero-overhead
picks); with --mtp, the checkpoint's MTP block drafting (random weights: drafts almost
never accepted), with zero-overhead scheduling carrying each row on the device. TPOT is the mean
per request of (finish - first token) / (tokens - 1); tok/s counts the output tokens of the decode
phase (first token to last finish). Each mode runs --warmup times untimed first: a step shape's
first use records its graph, which would otherwise land in the first mode's time. Plain decode
steps and (up to 64 rows) verify steps replay decode graphs; graph_verify_steps next to
verify_steps says how many did.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import deepinfer_core as dc
from v4_flash_config import flash_config, real_format


class Oracle(dc.Drafter):
    """Proposes the plain run's greedy continuation; each draft is right with probability p_right
    (one value for every request, or one per prompt), independently per position. Whether the
    draft at an output position is right depends only on (seed, prompt index, position), so every
    engine given the same prompts sees the same outcomes whatever its request ids."""

    def __init__(self, prompts, outputs, p_right: float | list[float], seed: int = 0) -> None:
        super().__init__()
        ps = list(p_right) if isinstance(p_right, list) else [p_right] * len(prompts)
        self.by_prompt = {
            tuple(p[:16]): (j, len(p), o, q)
            for j, (p, o, q) in enumerate(zip(prompts, outputs, ps, strict=True))
        }
        self.seed = seed

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        j, n, out, p_right = self.by_prompt[tuple(tokens[:16])]
        i = len(tokens) - n
        drafts = []
        for k, t in enumerate(out[i : i + max_drafts]):
            right = random.Random(hash((self.seed, j, i + k))).random() < p_right
            drafts.append(t if right else (t + 1) % 129000)
        return drafts


def agreement(want: list[list[int]], got: list[list[int]]) -> float:
    """The fraction of output positions where `got` has `want`'s token."""
    same = sum(a == c for x, y in zip(want, got, strict=True) for a, c in zip(x, y, strict=True))
    return same / sum(len(x) for x in want)


SPEC_COUNTERS = (
    "num_steps",
    "draft_tokens",
    "accepted_draft_tokens",
    "verify_rows",
    "verify_steps",
    "num_graph_steps",
    "num_graph_verify_steps",
    "device_carried_rows",
    "device_carried_verify_rows",
)
CALIBRATION_BINS = (
    "spec_calibration_drafts",
    "spec_calibration_accepted",
    "spec_calibration_estimate_sum",
)


def run(engine: dc.Engine, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], dict]:
    params = dc.SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    out: dict[int, list[int]] = {i: [] for i in ids}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    before = engine.stats()
    while engine.has_unfinished():
        for o in engine.step():
            now = time.perf_counter()
            if o.tokens and o.id not in first:
                first[o.id] = now
            out[o.id] += o.tokens
            if o.finish is not None:
                done[o.id] = now
    engine.step()
    after = engine.stats()
    tpot = sum((done[i] - first[i]) / (len(out[i]) - 1) for i in ids) / len(ids)
    decode_s = max(done.values()) - min(first.values())
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    bins = [
        [a - b for a, b in zip(after[key], before[key], strict=True)] for key in CALIBRATION_BINS
    ]
    drafts, accepted = d["draft_tokens"], d["accepted_draft_tokens"]
    rows, vsteps = d["verify_rows"], d["verify_steps"]
    return [out[i] for i in ids], {
        "tpot_ms": 1000 * tpot,
        "output_tok_s": sum(len(o) - 1 for o in out.values()) / decode_s,
        "acceptance": accepted / drafts if drafts else None,
        "steps": d["num_steps"],
        "verify_steps": vsteps,
        # Steps replayed from decode graphs, and those of them with a verify row (DeepSeek-V4
        # verify steps of up to 64 rows replay, cpp/src/model/decode_graphs.h).
        "graph_steps": d["num_graph_steps"],
        "graph_verify_steps": d["num_graph_verify_steps"],
        # Per decode step with at least one verify row, and per verify row (request and step).
        "verified_per_step": drafts / vsteps if vsteps else None,
        "accepted_per_step": accepted / vsteps if vsteps else None,
        "acceptance_length": 1 + accepted / rows if rows else None,
        # Engine.stats()'s spec_calibration_error over this run's drafts only (the engine's own
        # figure is cumulative): sum over bins of |sum of estimates - accepted| / drafts.
        "calibration_error": (
            sum(abs(e - a) for e, a in zip(bins[2], bins[1], strict=True)) / sum(bins[0])
            if sum(bins[0])
            else None
        ),
        "mean_estimate": sum(bins[2]) / sum(bins[0]) if sum(bins[0]) else None,
        "calibration_error_cumulative": after["spec_calibration_error"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="sliding,csa,hca")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument(
        "--spec-zero-overhead",
        choices=("both", "on", "off"),
        default="both",
        help="zero-overhead scheduling of the drafting engines",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of each mode first (they record the decode graphs its steps replay)",
    )
    parser.add_argument(
        "--mtp",
        choices=("off", "also", "only"),
        default="off",
        help="also (or only, without the oracle modes) the checkpoint's MTP block drafting "
        "(speculative_method mtp; random weights, so its drafts are almost never accepted: what "
        "drafting and, with zero-overhead scheduling, rows carried on the device cost)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = real_format(flash_config(args.layers.split(",")))
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        common = {
            "device": "cuda",
            "load_format": "dummy",
            "seed": 1,
            "max_num_seqs": max(batches),
            "max_num_batched_tokens": 8192,
            "max_model_len": args.prompt + args.tokens + 16,
            "enable_prefix_cache": False,
            # The engines share the device: explicit KV blocks (the batch's full lengths)
            # rather than each sizing itself from the memory the others leave.
            "num_kv_blocks": max(batches) * ((args.prompt + args.tokens + 16) // 128 + 2) + 8,
        }
        plain = dc.Engine(tmp, **common)
        no_zos = dc.Engine(tmp, zero_overhead=False, **common)
        zos_modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.spec_zero_overhead]
        specs = {
            zos: dc.Engine(
                tmp,
                num_speculative_tokens=args.drafts,
                speculative_method="external",
                zero_overhead=zos,
                speculative_zero_overhead=zos,
                **common,
            )
            for zos in zos_modes
        }
        mtp_specs = {
            zos: dc.Engine(
                tmp,
                num_speculative_tokens=args.drafts,
                speculative_method="mtp",
                zero_overhead=zos,
                speculative_zero_overhead=zos,
                **common,
            )
            for zos in (zos_modes if args.mtp != "off" else ())
        }
        for b in batches:
            rng = random.Random(b)
            prompts = [[rng.randrange(2, 129000) for _ in range(args.prompt)] for _ in range(b)]
            for _ in range(args.warmup):
                run(plain, prompts, args.tokens)
                run(no_zos, prompts, args.tokens)
            want, base = run(plain, prompts, args.tokens)
            rows = {
                "off (zero-overhead)": base,
                "off (no zero-overhead)": run(no_zos, prompts, args.tokens)[1],
            }
            for zos, spec in mtp_specs.items():
                for _ in range(args.warmup):
                    run(spec, prompts, args.tokens)
                outs, row = run(spec, prompts, args.tokens)
                row["greedy_agreement"] = agreement(want, outs)
                zos_name = "zero-overhead" if zos else "no zero-overhead"
                rows[f"k={args.drafts} MTP ({zos_name})"] = row
            oracle = (
                []
                if args.mtp == "only"
                else [("right", 1.0), ("p=0.8", 0.8), ("p=0.5", 0.5), ("wrong", 0.0)]
            )
            for name, p in oracle:
                for zos, spec in specs.items():
                    spec.set_drafter(Oracle(prompts, want, p))
                    for _ in range(args.warmup):
                        run(spec, prompts, args.tokens)
                    outs, row = run(spec, prompts, args.tokens)
                    row["greedy_agreement"] = agreement(want, outs)
                    zos_name = "zero-overhead" if zos else "no zero-overhead"
                    rows[f"k={args.drafts} {name} ({zos_name})"] = row
            for mode, row in rows.items():
                rec = {"B": b, "mode": mode, **row, "tpot_vs_off": row["tpot_ms"] / base["tpot_ms"]}
                results.append(rec)
                print(json.dumps(rec), flush=True)
    print("ENGINE-SPEC-BENCH " + json.dumps(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
