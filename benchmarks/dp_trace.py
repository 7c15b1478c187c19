"""Steps lost to DP-group voting in the real engine, on a mixed trace (CPU, the tiny model).

    python benchmarks/dp_trace.py [--ranks 2,4] [--requests 64] [--seed 0]

A seeded trace of requests with mixed prompt lengths (8..600 tokens) and output lengths (4..64)
arrives over the run (a few per step, in bursts), through the least-loaded routing of a group of
data-parallel, expert-parallel ranks (threads over the in-process communicator). Reported per
rank count: the steps the group ran, the rank-steps run without rows (dummy decodes and empty
prefills: what voting costs) as a share of all rank-steps, and the mean steps from arrival to the
first token. The same trace on one rank is the reference for the step count. The vote intervals
are DeepSeek's (ALL 70, ANY 100); a request reaching a group where nobody decodes is prefilled at
the next step (dp_prefill_when_idle).
"""

from __future__ import annotations

import argparse
import random

import deepinfer_core as dc
from deepinfer.tiny import ensure_tiny_checkpoint


def trace(n: int, seed: int) -> list[tuple[int, list[int], int]]:
    """(arrival step, prompt, max_tokens) per request."""
    rng = random.Random(seed)
    out, step = [], 0
    for _ in range(n):
        step += rng.choice([0, 0, 0, 1, 2, 5, 20])  # bursts and gaps
        prompt = [rng.randrange(2, 129000) for _ in range(rng.choice([8, 40, 120, 300, 600]))]
        out.append((step, prompt, rng.choice([4, 16, 32, 64])))
    return out


def run(path: str, ranks: int, requests: list[tuple[int, list[int], int]]) -> dict:
    options = {"device": "cpu", "max_num_seqs": 16}
    if ranks > 1:
        options |= {"data_parallel_size": ranks, "expert_parallel_size": ranks}
    engine = dc.Engine(path, **options)
    pending = list(requests)
    arrived, first = {}, {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, max_tokens = pending.pop(0)
            params = dc.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            arrived[engine.add_request(prompt, params)] = step
        for o in engine.step():
            if o.tokens and o.id not in first:
                first[o.id] = step
        step += 1
    s = engine.stats()
    group_steps = s["dp_group_steps"] if ranks > 1 else s["num_steps"]
    rank_steps = group_steps * ranks
    ttft = [first[i] - arrived[i] for i in arrived]
    return {
        "ranks": ranks,
        "loop_steps": step,
        "group_steps": group_steps,
        "idle_passes": s["dp_idle_passes"],
        "lost_share": s["dp_idle_passes"] / rank_steps if rank_steps else 0.0,
        "mean_steps_to_first_token": sum(ttft) / len(ttft),
        "generated": s["generated_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = str(ensure_tiny_checkpoint())
    requests = trace(args.requests, args.seed)
    rows = [run(path, 1, requests)] + [run(path, int(r), requests) for r in args.ranks.split(",")]
    print("| ranks | group steps | rank-steps without rows | share lost | steps to 1st token |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['ranks']} | {r['group_steps']} | {r['idle_passes']} | "
            f"{100 * r['lost_share']:.1f}% | {r['mean_steps_to_first_token']:.1f} |"
        )


if __name__ == "__main__":
    main()
