"""Speculative decoding through the whole engine on the GPU: V4-Flash widths (a few layers, random
weights in the shipped formats, load_format dummy), greedy, next to speculation off.

    python benchmarks/gpu_engine_spec_bench.py [--layers sliding,csa,hca] [--batches 1,8,64]

For each batch size B: B requests of --prompt random tokens generate --tokens tokens each.
Modes: speculation off with zero-overhead scheduling (the default engine), speculation off
without it (what drafting costs in scheduling alone), and an oracle drafter fed the plain run's
greedy continuation with k drafts per step that are always right, right with probability 0.8 and
0.5 per position (independent), and always wrong. TPOT is the mean per request of (finish - first
token) / (tokens - 1); tok/s counts the output tokens of the decode phase (first token to last
finish). The verify steps run eagerly (decode graphs hold one-token rows), the plain decode
steps through graphs.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import deepinfer_core as dc
from gpu_quant_bench import real_format
from v4_flash_config import flash_config


class Oracle(dc.Drafter):
    def __init__(self, prompts, outputs, p_right: float, seed: int = 0) -> None:
        super().__init__()
        self.by_prompt = {tuple(p[:16]): (len(p), o) for p, o in zip(prompts, outputs, strict=True)}
        self.p_right = p_right
        self.seed = seed

    def propose(self, request_id: int, tokens: list[int], max_drafts: int) -> list[int]:
        n, out = self.by_prompt[tuple(tokens[:16])]
        i = len(tokens) - n
        drafts = []
        for k, t in enumerate(out[i : i + max_drafts]):
            right = random.Random(hash((self.seed, request_id, i + k))).random() < self.p_right
            drafts.append(t if right else (t + 1) % 129000)
        return drafts


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
    drafts = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_draft_tokens"] - before["accepted_draft_tokens"]
    steps = after["num_steps"] - before["num_steps"]
    return [out[i] for i in ids], {
        "tpot_ms": 1000 * tpot,
        "output_tok_s": sum(len(o) - 1 for o in out.values()) / decode_s,
        "acceptance": accepted / drafts if drafts else None,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="sliding,csa,hca")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=3)
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
            # Three engines share the device: explicit KV blocks (the batch's full lengths)
            # rather than each sizing itself from the memory the others leave.
            "num_kv_blocks": max(batches) * ((args.prompt + args.tokens + 16) // 128 + 2) + 8,
        }
        plain = dc.Engine(tmp, **common)
        no_zos = dc.Engine(tmp, zero_overhead=False, **common)
        spec = dc.Engine(
            tmp, num_speculative_tokens=args.drafts, speculative_method="external", **common
        )
        for b in batches:
            rng = random.Random(b)
            prompts = [[rng.randrange(2, 129000) for _ in range(args.prompt)] for _ in range(b)]
            want, base = run(plain, prompts, args.tokens)
            rows = {
                "off (zero-overhead)": base,
                "off (no zero-overhead)": run(no_zos, prompts, args.tokens)[1],
            }
            for name, p in (("right", 1.0), ("p=0.8", 0.8), ("p=0.5", 0.5), ("wrong", 0.0)):
                spec.set_drafter(Oracle(prompts, want, p))
                outs, row = run(spec, prompts, args.tokens)
                same = sum(
                    a == c
                    for x, y in zip(want, outs, strict=True)
                    for a, c in zip(x, y, strict=True)
                )
                row["greedy_agreement"] = same / sum(len(x) for x in want)
                rows[f"k={args.drafts} {name}"] = row
            for mode, row in rows.items():
                rec = {"B": b, "mode": mode, **row, "tpot_vs_off": row["tpot_ms"] / base["tpot_ms"]}
                results.append(rec)
                print(json.dumps(rec), flush=True)
    print("ENGINE-SPEC-BENCH " + json.dumps(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
