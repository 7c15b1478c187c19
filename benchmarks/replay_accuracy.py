"""What kv_window_state bounded_replay costs in accuracy (docs/kv_store.md#window-state-on-a-hit).

For each hit length h (a multiple of 128) a prompt of h + TAIL tokens is run twice over one
ModelRunner:

- exact: prefilled from 0 in its own state slot (what an exact-mode hit reproduces bit for bit);
- bounded_replay: a fresh (zeroed) state slot, the exact run's paged blocks for [0, h) (the
  compressed entries and index keys a store hit supplies), and a prefill from r = max(0, h - 128)
  with every sliding window confined to keys >= r and the entries of windows closing by h kept.

Then both decode N tokens, teacher-forced on the exact run's greedy tokens, so every step compares
the two distributions over the same context. Reported per h: max over the N + 1 logit rows of
max|logit_replay - logit_exact| / max|logit_exact|, and greedy agreement (the fraction of rows
whose argmax is the same).

CPU: the tiny checkpoint (deepinfer.tiny). GPU: DeepSeek-V4-Flash widths with random weights and a
few layers (benchmarks/v4_flash_config.py).

  python3 benchmarks/replay_accuracy.py --device cpu --out replay_cpu.json
  python3 benchmarks/replay_accuracy.py --device cuda --lengths 1024,4096,16384,65536 \\
      --out replay_gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPLAY_TOKENS = 128  # sched::kReplayTokens
BLOCK = 128
TAIL = 16  # prompt tokens after the hit point, computed by both runs
PREFILL_CHUNK = 8192


def prompt_tokens(n: int, vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(2, min(vocab, 129000), size=n)]


def make_runner(args, max_len: int):
    import deepinfer_core as dc

    blocks_per_seq = max_len // BLOCK + 2
    # Two tables: the exact run's, and the replay's fresh blocks past the hit.
    num_blocks = 1 + 2 * blocks_per_seq
    if args.device == "cpu":
        from deepinfer.tiny import ensure_tiny_checkpoint

        checkpoint = ensure_tiny_checkpoint()
        if args.window:
            # The same weights with another sliding window (the window is no tensor).
            copy = Path(tempfile.mkdtemp())
            for f in checkpoint.iterdir():
                if f.is_file() and f.name != "config.json":
                    (copy / f.name).symlink_to(f)
            config = json.loads((checkpoint / "config.json").read_text())
            config["sliding_window"] = args.window
            (copy / "config.json").write_text(json.dumps(config))
            checkpoint = copy
        return dc.ModelRunner(
            str(checkpoint),
            num_blocks=num_blocks,
            num_state_slots=3,
            device="cpu",
        ), blocks_per_seq
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from v4_flash_config import flash_config

    config = flash_config(args.layers.split(","))
    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(config))
    return dc.ModelRunner.random(
        str(path),
        num_blocks=num_blocks,
        num_state_slots=3,
        device=args.device,
        seed=1,
    ), blocks_per_seq


def measure(runner, blocks_per_seq: int, h: int, steps: int, seed: int) -> dict:
    import deepinfer_core as dc

    vocab = runner.config.vocab_size
    length = h + TAIL
    prompt = prompt_tokens(length, vocab, seed)
    exact_table = list(range(1, 1 + blocks_per_seq))
    # The replay shares the exact run's blocks for [0, h) (a store hit's bytes) and has its own
    # blocks from h on (h is a block boundary).
    replay_table = exact_table[: h // BLOCK] + list(
        range(1 + blocks_per_seq, 1 + 2 * blocks_per_seq - h // BLOCK)
    )
    r = max(0, h - REPLAY_TOKENS)
    exact_logits = None
    for start in range(0, length, PREFILL_CHUNK):
        chunk = prompt[start : start + PREFILL_CHUNK]
        exact_logits = runner.forward([dc.SequenceChunk(1, start, chunk, exact_table)], "last")
    replay_logits = runner.forward(
        [dc.SequenceChunk(2, r, prompt[r:], replay_table, swa_valid_start=r, replay_end=h)],
        "last",
    )
    rows_e, rows_r = [exact_logits[0]], [replay_logits[0]]
    pos = length
    for _ in range(steps):
        token = int(np.argmax(rows_e[-1]))  # the exact run's greedy token feeds both
        out = runner.forward(
            [
                dc.SequenceChunk(1, pos, [token], exact_table),
                dc.SequenceChunk(2, pos, [token], replay_table, swa_valid_start=r, replay_end=h),
            ],
            "last",
        )
        rows_e.append(out[0])
        rows_r.append(out[1])
        pos += 1
    e = np.stack(rows_e).astype(np.float64)
    rr = np.stack(rows_r).astype(np.float64)
    drift = np.max(np.abs(rr - e), axis=1) / np.max(np.abs(e), axis=1)
    agree = np.argmax(rr, axis=1) == np.argmax(e, axis=1)
    return {
        "hit": h,
        "replay_start": r,
        "rows": int(e.shape[0]),
        "max_rel_logit_drift": float(np.max(drift)),
        "first_row_rel_logit_drift": float(drift[0]),
        "greedy_agreement": float(np.mean(agree)),
        "bitwise_equal": bool(np.array_equal(rr, e)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (tiny checkpoint) or cuda")
    parser.add_argument("--lengths", default="", help="hit lengths (multiples of 128)")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps compared")
    parser.add_argument("--layers", default="sliding,csa,hca,csa", help="GPU: Flash layer kinds")
    parser.add_argument(
        "--window", type=int, default=0, help="CPU: the tiny model with this sliding window"
    )
    parser.add_argument(
        "--seeds", type=int, default=0, help="prompts per hit length (0: 2 on cpu, 1 on cuda)"
    )
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    # 128: r = 0, a control that must be bit-identical.
    default = "128,256,512,1024,2048" if args.device == "cpu" else "1024,4096,16384,65536"
    lengths = [int(x) for x in (args.lengths or default).split(",")]
    if args.seeds <= 0:
        args.seeds = 2 if args.device == "cpu" else 1
    for h in lengths:
        if h <= 0 or h % BLOCK:
            parser.error(f"--lengths: {h} is not a positive multiple of {BLOCK}")
    started = time.perf_counter()
    runner, blocks_per_seq = make_runner(args, max(lengths) + TAIL + args.tokens)
    results = []
    window = runner.config.sliding_window
    print(f"sliding_window {window}, {args.tokens} decode steps (teacher-forced)")
    print(f"{'hit':>7} {'seed':>4} {'max drift/max|logit|':>21} {'row-0 drift':>12} {'agree':>6}")
    for h in lengths:
        for seed in range(args.seeds):
            m = measure(runner, blocks_per_seq, h, args.tokens, seed)
            m["seed"] = seed
            results.append(m)
            print(
                f"{h:>7} {seed:>4} {m['max_rel_logit_drift']:>21.3e} "
                f"{m['first_row_rel_logit_drift']:>12.3e} {m['greedy_agreement']:>6.2f}"
                + ("  (bit-identical)" if m["bitwise_equal"] else ""),
                flush=True,
            )
    report = {
        "device": args.device,
        "layers": args.layers if args.device != "cpu" else "tiny",
        "sliding_window": runner.config.sliding_window,
        "replay_tokens": REPLAY_TOKENS,
        "tail": TAIL,
        "decode_tokens": args.tokens,
        "seconds": time.perf_counter() - started,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
