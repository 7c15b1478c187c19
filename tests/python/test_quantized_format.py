"""The quantized-checkpoint format facts the loader relies on, pinned against hand-made bytes, and
the dynamic FP8 activation quantization op against DeepGEMM's formula.

Primary sources (paraphrased; file:line from /tmp/FACTS_saved.md, DeepGEMM sdist 2.8.2 "DG" and
transformers 5.23 "TF"):

* MXFP4 packing: DG utils/math.py:112-114 (per_token_cast_to_fp4) views the codes as pairs along
  the input (K) dim and puts element 2j in the low nibble and 2j+1 in the high nibble of byte j;
  DG math.py:161-163 (cast_back_from_fp4) and TF finegrained_fp8.py:1121-1128 (_unpack_fp4)
  unpack the same way.
* e2m1 table: DG math.py:144-148 maps the low three bits to {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 is
  the sign (TF finegrained_fp8.py:1119 lists the 16 values, -0.0 at code 8).
* MXFP4 scales: one E8M0 byte per 32 inputs of each output row, shape [N, K/32] (DG
  tests/test_mega_moe.py:103-108; TF finegrained_fp8.py:749-761).
* E8M0: value 2^(byte - 127) (TF finegrained_fp8.py:1163-1167; DG math.py:152 shifts the byte into
  the float's exponent field); 0xff is NaN (DG smxx_layout.cuh:187).
* Scales multiply: dequantized = code value * scale, for MXFP4 (DG math.py:166) and FP8 blocks
  alike, although transformers calls the FP8 one weight_scale_inv (TF finegrained_fp8.py:1173).
* FP8 blocks: weight_block_size [r, c] is (output rows, input columns); the scale grid is
  [ceil(N/r), ceil(K/c)] (TF finegrained_fp8.py:414-417; DG per_block_cast_to_fp8 math.py:62-72).
* Activations (DG math.py:26-38, per_token_cast_to_fp8 with use_ue8m0): per token, groups of
  gran_k (zero-padded), amax clamped to 1e-4, scale = amax / 448 rounded up to a power of two
  (ceil_to_ue8m0, math.py:13-16), values x * (1 / scale) cast to e4m3 (nearest even).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import deepinfer_core
import numpy as np
import pytest
import quant_checkpoint as qc
import torch
import v4_reference as ref
from runner_driver import RunnerDriver
from safetensors.torch import save_file

REL_TOL = 1e-4
# Non-square blocks, so the scale grid's orientation is pinned by its shape.
SPEC = qc.QuantSpec(block=(16, 32), experts="fp4")
PROMPT = ref.random_tokens(24, 128, 11)

# TF's 16-entry e2m1 table (finegrained_fp8.py:1119), written out here rather than derived.
E2M1_BY_CODE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_BY_CODE += [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ---- The maker's own format helpers -------------------------------------------------------------


def test_mxfp4_packs_half_and_minus_one_as_0xe4_with_scale_quarter() -> None:
    row = torch.zeros(1, 32)
    row[0, 0], row[0, 1] = 0.5, -1.0
    packed, scale = qc.quantize_mxfp4(row)
    # amax 1 -> scale ceil_pow2(1/6) = 0.25 (byte 125); 0.5/0.25 = 2 (code 4, low nibble) and
    # -1/0.25 = -4 (code 0xE, high nibble).
    assert packed.dtype == torch.int8 and tuple(packed.shape) == (1, 16)
    assert int(packed.view(torch.uint8)[0, 0]) == 0xE4
    assert int(packed.view(torch.uint8)[0, 1:].max()) == 0
    assert int(scale[0, 0]) == 125 and float(qc.e8m0_decode(scale)[0, 0]) == 0.25
    np.testing.assert_array_equal(qc.dequantize_mxfp4(packed, qc.e8m0_decode(scale)), row)


def test_e2m1_rounding_ties_go_to_the_even_code() -> None:
    halfway = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.1, -0.0])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0, 0.0]
    codes = qc.e2m1_codes(halfway)
    assert [E2M1_BY_CODE[int(c)] for c in codes] == want
    assert int(codes[-2]) == 0 and int(codes[-1]) == 0  # no negative zero is written


def test_e8m0_decoding() -> None:
    b = torch.tensor([0, 1, 125, 127, 128, 254, 255], dtype=torch.uint8)
    got = qc.e8m0_decode(b)
    want = [2.0**-127, 2.0**-126, 0.25, 1.0, 2.0, 2.0**127]
    assert got[:6].tolist() == want and bool(torch.isnan(got[6]))
    # torch's own float8_e8m0fnu agrees (the dtype safetensors writes as F8_E8M0).
    torch.testing.assert_close(qc.as_e8m0(b).float(), got, equal_nan=True, rtol=0, atol=0)


def test_fp8_block_scale_is_amax_over_448_rounded_up() -> None:
    w = torch.zeros(20, 40)
    w[0, 0] = 448.0  # block (0, 0): exactly 448 -> scale 1
    w[17, 1] = 449.0  # block (1, 0), a ragged 4-row block: just above -> scale 2
    w[3, 35] = 1e-9  # block (0, 1), a ragged 8-column block: amax clamps to 1e-4 -> 2^-22
    codes, scale = qc.quantize_fp8_blocks(w, (16, 32))
    assert tuple(scale.shape) == (2, 2)
    decoded = qc.e8m0_decode(scale)
    assert decoded.tolist() == [[1.0, 2.0**-22], [2.0, 2.0**-22]]
    assert float(codes[0, 0].float()) == 448.0 and float(codes[17, 1].float()) == 224.0
    # 449 / 2 = 224.5 rounds to the nearest e4m3 (224 and 240 neighbour it).


# ---- The engine reads hand-made bytes as the sources say ----------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> qc.QuantizedCheckpoint:
    model = qc.make_quantizable_model(ref.F2_CONFIG, seed=4)
    return qc.write_quantized_checkpoint(model, tmp_path_factory.mktemp("fmt") / "ckpt", SPEC)


def engine_logits(path: Path, **options) -> np.ndarray:
    driver = RunnerDriver(str(path), max_seqs=1, max_len=len(PROMPT), **options)
    return driver.run_schedule(PROMPT, [len(PROMPT)])


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def rewrite(ckpt: qc.QuantizedCheckpoint, dst: Path, changes: dict[str, torch.Tensor]) -> Path:
    dst.mkdir()
    (dst / "config.json").write_text((ckpt.path / "config.json").read_text())
    tensors = dict(ckpt.tensors)
    tensors.update(changes)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def reference_logits(ckpt: qc.QuantizedCheckpoint, edit) -> np.ndarray:
    model = copy.deepcopy(ckpt.reference)
    with torch.no_grad():
        edit(model)
    return ref.logits_one_shot(model, PROMPT)


def test_engine_unpacks_mxfp4_low_nibble_first_and_multiplies_scales(small, tmp_path) -> None:
    cfg = small.reference.config
    inter, hidden = cfg.moe_intermediate_size, cfg.hidden_size
    # Layer 0 routes by hash: pick an expert the first prompt token uses.
    expert = int(small.reference.model.layers[0].mlp.gate.tid2eid[PROMPT[0], 0])
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (inter, hidden // 2), generator=gen, dtype=torch.uint8)
    scale = torch.randint(121, 126, (inter, hidden // 32), generator=gen, dtype=torch.uint8)
    packed[0, 0], scale[0, 0] = 0xE4, 125  # inputs 0, 1 of row 0: [0.5, -1.0]
    name = f"layers.0.ffn.experts.{expert}.w1"
    path = rewrite(
        small,
        tmp_path / "handmade",
        {name + ".weight": packed.view(torch.int8), name + ".scale": qc.as_e8m0(scale)},
    )

    def values(low_first: bool, multiply: bool) -> torch.Tensor:
        out = torch.empty(inter, hidden)
        for n in range(inter):
            for j in range(hidden // 2):
                byte = int(packed[n, j])
                lo, hi = E2M1_BY_CODE[byte & 0xF], E2M1_BY_CODE[byte >> 4]
                s = 2.0 ** (int(scale[n, (2 * j) // 32]) - 127)
                pair = (lo, hi) if low_first else (hi, lo)
                for i, v in enumerate(pair):
                    out[n, 2 * j + i] = v * s if multiply else v / s
        return out

    assert values(True, True)[0, :2].tolist() == [0.5, -1.0]

    def with_w1(w1: torch.Tensor):
        def edit(model) -> None:
            model.model.layers[0].mlp.experts.gate_up_proj[expert, :inter] = w1

        return edit

    ours = engine_logits(path)
    right = reference_logits(small, with_w1(values(True, True)))
    assert rel_diff(ours, right) <= REL_TOL
    # The alternatives the test must be able to tell apart really differ.
    for low_first, multiply in [(False, True), (True, False)]:
        wrong = reference_logits(small, with_w1(values(low_first, multiply)))
        assert rel_diff(ours, wrong) > 100 * REL_TOL, (low_first, multiply)


def test_engine_multiplies_fp8_block_scales(small, tmp_path) -> None:
    name = "layers.0.attn.wq_a"
    codes = small.tensors[name + ".weight"]
    n, k = codes.shape
    r, c = SPEC.block
    gen = torch.Generator().manual_seed(1)
    scale = torch.randint(120, 130, (-(-n // r), -(-k // c)), generator=gen, dtype=torch.uint8)
    path = rewrite(small, tmp_path / "handmade", {name + ".scale": qc.as_e8m0(scale)})

    def values(multiply: bool) -> torch.Tensor:
        out = codes.float().clone()
        for i in range(n):
            for j in range(k):
                s = 2.0 ** (int(scale[i // r, j // c]) - 127)
                out[i, j] = out[i, j] * s if multiply else out[i, j] / s
        return out

    def with_wq_a(w: torch.Tensor):
        def edit(model) -> None:
            model.model.layers[0].self_attn.q_a_proj.weight.copy_(w)

        return edit

    ours = engine_logits(path)
    assert rel_diff(ours, reference_logits(small, with_wq_a(values(True)))) <= REL_TOL
    assert rel_diff(ours, reference_logits(small, with_wq_a(values(False)))) > 100 * REL_TOL


def test_smallest_e8m0_scales_are_read_exactly(small, tmp_path) -> None:
    """Bytes 0 and 1 (2^-127, an fp32 subnormal, and 2^-126) are valid scales, not zero."""
    name = "layers.0.attn.wq_a"
    codes = small.tensors[name + ".weight"]
    scale = small.tensors[name + ".scale"].view(torch.uint8).clone()
    scale[0, 0], scale[1, 1] = 0, 1
    path = rewrite(small, tmp_path / "tiny", {name + ".scale": qc.as_e8m0(scale)})

    def edit(model) -> None:
        w = qc.dequantize_fp8_blocks(codes, qc.e8m0_decode(scale), SPEC.block)
        assert (
            float(w[:16, :32].abs().max()) == float(codes[:16, :32].float().abs().max()) * 2.0**-127
        )
        model.model.layers[0].self_attn.q_a_proj.weight.copy_(w)

    assert rel_diff(engine_logits(path), reference_logits(small, edit)) <= REL_TOL


def test_float_scales_under_scale_fmt_float_need_not_be_powers_of_two(small, tmp_path) -> None:
    """scale_fmt "float" (transformers' spelling, F32 weight_scale_inv): any positive scale."""
    name = "layers.0.attn.wq_a"
    codes = small.tensors[name + ".weight"]
    scale = qc.e8m0_decode(small.tensors[name + ".scale"].view(torch.uint8)) * 0.7
    path = rewrite(small, tmp_path / "float", {name + ".scale": scale})
    cfg = (path / "config.json").read_text().replace('"ue8m0"', '"float"')
    (path / "config.json").write_text(cfg)

    def edit(model) -> None:
        w = qc.dequantize_fp8_blocks(codes, scale, SPEC.block)
        model.model.layers[0].self_attn.q_a_proj.weight.copy_(w)

    assert rel_diff(engine_logits(path), reference_logits(small, edit)) <= REL_TOL


def mtp_block(small: qc.QuantizedCheckpoint, quantized_projections: bool) -> dict:
    """A complete mtp.0.* block in the checkpoint's formats, from its own tensors: sliding
    attention of layer 0, the score-routed MoE (FP8 shared, MXFP4 routed experts) and mHC of layer
    2, and FP8 e_proj / h_proj (or the same values dequantized to f32)."""
    t = small.tensors
    block: dict[str, torch.Tensor] = {}
    for name, value in t.items():
        if name.startswith("layers.0.attn."):
            block["mtp.0." + name.removeprefix("layers.0.")] = value.clone()
        elif name.startswith("layers.2.") and not name.startswith("layers.2.attn."):
            block["mtp.0." + name.removeprefix("layers.2.")] = value.clone()
    for leaf in ("fn", "base", "scale"):
        block[f"mtp.0.hc_head_{leaf}"] = t[f"hc_head_{leaf}"].clone()
    for norm in ("enorm", "hnorm", "norm"):
        block[f"mtp.0.{norm}.weight"] = t["norm.weight"].clone()
    gen = torch.Generator().manual_seed(5)
    for proj in ("e_proj", "h_proj"):
        w = torch.randn(64, 64, generator=gen) / 8.0
        codes, scale = qc.quantize_fp8_blocks(w, SPEC.block)
        if quantized_projections:
            block[f"mtp.0.{proj}.weight"] = codes
            block[f"mtp.0.{proj}.scale"] = qc.as_e8m0(scale)
        else:
            exact = qc.dequantize_fp8_blocks(codes, qc.e8m0_decode(scale), SPEC.block)
            block[f"mtp.0.{proj}.weight"] = exact.contiguous()
    return block


def mtp_logits(path: Path) -> np.ndarray:
    driver = RunnerDriver(str(path), max_seqs=1, max_len=len(PROMPT))
    runner = driver.runner
    assert runner.num_mtp_blocks == 1
    _, hidden = runner.forward_hidden([driver.chunk(0, 0, PROMPT)])
    logits, _ = runner.mtp_forward([driver.chunk(0, 0, [*PROMPT[1:], 3])], hidden)
    return logits


def test_mtp_block_loads_in_the_quantized_formats(small, tmp_path) -> None:
    """DeepSeek ships its multi-token-prediction block (mtp.0.*) FP8 / MXFP4 like the main
    layers: it loads, leaves the main logits alone, and its FP8 e_proj / h_proj read exactly as
    their dequantized values do."""
    quantized = rewrite(small, tmp_path / "fp8", mtp_block(small, quantized_projections=True))
    exact = rewrite(small, tmp_path / "f32", mtp_block(small, quantized_projections=False))
    np.testing.assert_array_equal(engine_logits(quantized), engine_logits(small.path))
    ours = mtp_logits(quantized)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, mtp_logits(exact), rtol=0, atol=1e-5 * np.abs(ours).max())


def test_incomplete_mtp_block_is_refused_naming_the_missing_tensor(small, tmp_path) -> None:
    extra = {
        "mtp.0.attn.wq_a.weight": small.tensors["layers.0.attn.wq_a.weight"].clone(),
        "mtp.0.attn.wq_a.scale": small.tensors["layers.0.attn.wq_a.scale"].clone(),
        "mtp.0.norm.weight": torch.ones(64, dtype=torch.bfloat16),
    }
    path = rewrite(small, tmp_path / "mtp", extra)
    with pytest.raises(FileNotFoundError, match=r"no tensor 'mtp\.0\.enorm\.weight'"):
        engine_logits(path)


def test_mtp_blocks_beyond_num_nextn_predict_layers_are_skipped_with_a_note(small, tmp_path):
    path = rewrite(small, tmp_path / "off", mtp_block(small, quantized_projections=True))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 0}))
    np.testing.assert_array_equal(engine_logits(path), engine_logits(small.path))
    runner = deepinfer_core.ModelRunner(str(path), num_blocks=2, num_state_slots=1, device="cpu")
    assert runner.num_mtp_blocks == 0
    engine = deepinfer_core.Engine(str(path), device="cpu", max_num_seqs=1, num_kv_blocks=4)
    assert any("skipped" in n and "mtp.*" in n for n in engine.load_notes), engine.load_notes


# ---- Activation quantization op -----------------------------------------------------------------


def activation_inputs() -> np.ndarray:
    """Rows of 200 columns (ragged for every group size used) that hit the formula's corners."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 200)).astype(np.float32)
    x *= np.exp2(rng.integers(-20, 20, size=(12, 1))).astype(np.float32)  # scales across rows
    x[0, :] = 0.0  # all-zero row: amax clamps to 1e-4, every value stays 0
    x[1, :] = 1e-7  # below the clamp: scale 2^-22
    x[2, :32] = 448.0  # amax exactly 448: scale 1
    x[2, 1] = 1.0625  # halfway between e4m3 1.0 and 1.125: ties to even (1.0)
    x[2, 2] = 1.1875  # halfway between 1.125 and 1.25: ties to even (1.25)
    x[3, :] = rng.standard_normal(200).astype(np.float32) * 2.0**-12  # tiny: e4m3 subnormals
    x[3, 5] = 1.0  # one big value per group of 32 ...
    x[3, 100] = -3.0
    x[4, 7] = np.float32(448.0 * 2.0**-30) * np.float32(1.0000001)  # amax just above 2^k * 448
    return x


@pytest.mark.parametrize("group", [16, 32, 128])
def test_quantize_activations_op_matches_deepgemm_formula(group: int) -> None:
    x = activation_inputs()
    ours = deepinfer_core.testing.quantize_activations(x, group)
    want = qc.fake_quantize_activations(torch.from_numpy(x), group).numpy()
    assert ours.shape == x.shape and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, want)
    assert not np.array_equal(ours, x)  # it quantized


def test_quantize_activations_hand_values() -> None:
    x = np.zeros((2, 40), dtype=np.float32)
    x[0, :4] = [448.0, 1.0625, 1.1875, -17.0]  # group 0: scale 1
    x[0, 32:34] = [3.0, 1.0]  # group 1 (ragged, 8 wide): amax 3 -> scale 2^-7
    x[1, :2] = [0.0, -0.0]
    out = deepinfer_core.testing.quantize_activations(x, 32)
    assert out[0, :4].tolist() == [448.0, 1.0, 1.25, -16.0]  # e4m3 step is 2 in [16, 32)
    assert out[0, 32:34].tolist() == [3.0, 1.0]  # exact in e4m3 times 2^-7
    assert not out[1].any()


def test_quantize_activations_rejects_a_bad_group() -> None:
    with pytest.raises(ValueError, match="group must be positive"):
        deepinfer_core.testing.quantize_activations(np.ones((1, 4), dtype=np.float32), 0)


# ---- The command line on a real-format checkpoint ------------------------------------------------


def test_run_generates_from_a_real_format_checkpoint(tmp_path, capsys) -> None:
    """`python -m deepinfer.run --config CONFIG` on a directory in DeepSeek's shipped formats: the
    embedded tiny model's shapes (the V4 tokenizer's vocabulary) with FP8 32x32 blocks and MXFP4
    experts, original tensor names."""
    from deepinfer import run
    from deepinfer.tiny import TINY_CONFIG

    config = {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type")}
    model = qc.make_quantizable_model(config, seed=2)
    ckpt = qc.write_quantized_checkpoint(model, tmp_path / "v4-fp8", qc.QuantSpec(block=(32, 32)))
    assert "expert_dtype" in (ckpt.path / "config.json").read_text()
    run_config = tmp_path / "run.yaml"
    run_config.write_text(
        f"model: {ckpt.path}\n"
        "engine: {device: cpu, max_num_seqs: 2}\n"
        'prompts: ["Hello", "The capital of France is"]\n'
    )
    args = ["--config", str(run_config), "--quiet", "--no-progress", "--max-tokens", "4"]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    assert f"model:          {ckpt.path}" in out
    assert "output tokens:  8," in out
