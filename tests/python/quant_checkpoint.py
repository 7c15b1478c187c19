"""Tiny DeepSeek-V4 checkpoints in DeepSeek's shipped quantized format, and their fp32 reference.

`write_quantized_checkpoint` takes a random transformers ``DeepseekV4ForCausalLM`` (v4_reference)
and writes it the way DeepSeek ships V4 (docs/model.md#quantized-checkpoints, /work/shared/reference
/model.md A.14):

* the GEMM weights DeepSeek quantizes (attention wq_a, wq_b, wkv, wo_a, wo_b, indexer wq_b, shared
  experts w1/w2/w3, and the routed experts when they are not MXFP4) as F8_E4M3 with one
  power-of-two scale per [r, c] block, stored in a sibling ``<base>.scale`` of dtype F8_E8M0 and
  shape [ceil(N/r), ceil(K/c)];
* with ``experts="fp4"``, routed experts ``layers.L.ffn.experts.E.w{1,2,3}.weight`` as I8 packed
  e2m1 pairs [N, K/2] (input 2j in the low nibble of byte j, 2j+1 in the high one) with one E8M0
  scale per 32 inputs [N, K/32];
* everything else dense, in the dtype DeepSeek ships: F32 for the mHC parameters, attention sinks,
  compressor position biases and router biases, I64 for tid2eid, BF16 for the rest;
* config.json with ``quantization_config`` (quant_method fp8, fmt e4m3, scale_fmt ue8m0,
  weight_block_size, activation_scheme dynamic) and, for MXFP4 experts, a top-level
  ``expert_dtype: "fp4"``.

``spelling="transformers"`` writes the names transformers' save_pretrained uses instead (``model.``
prefix, ``attn.norm``, ``embed_tokens``...), the scales as float32 ``<base>.weight_scale_inv``, and
``expert_dtype`` inside quantization_config.

The quantizers follow DeepSeek's recipes (DeepGEMM ``per_block_cast_to_fp8`` with ue8m0 and
``per_token_cast_to_fp4`` with gran_k 32; /tmp/FACTS_saved.md (b), (c)) but are written here from
their description: amax per block (clamped to 1e-4), scale = amax / max_code rounded *up* to a
power of two, values divided by the scale and rounded to the nearest code.

The reference is the same transformers model in fp32 whose every weight is the exact value the
checkpoint stores: codes times scales for quantized tensors, the bf16 value for dense ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import v4_reference as ref
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_MAX = 6.0  # largest e2m1 magnitude
MXFP4_GROUP = 32  # inputs per MXFP4 scale
E8M0_BIAS = 127

# e2m1 magnitudes by the low three bits of a code; bit 3 is the sign (FACTS (a)).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding thresholds between neighbouring magnitudes; a value exactly on a threshold goes to the
# code with the even index (round half to even on the code, FACTS (a)).
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False))
E2M1_THRESHOLDS += ((3.5, True), (5.0, False))  # (threshold, inclusive)

# Original DeepSeek names of the GEMM weights DeepSeek ships in FP8 (model.md A.14).
_FP8_DENSE = re.compile(
    r"layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123])"
    r"\.weight"
)
_ROUTED_EXPERT = re.compile(r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight")
# Dense tensors DeepSeek ships in F32 (model.md A.14); every other dense float tensor is BF16.
_F32_DENSE = re.compile(
    r"(^hc_head_(fn|base|scale)$|\.hc_(attn|ffn)_(fn|base|scale)$|\.attn_sink$|\.ape$|"
    r"\.ffn\.gate\.bias$)"
)


# ---- Formats ------------------------------------------------------------------------------------


def ceil_pow2(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= x for positive normal fp32 x, by the float's bit fields:
    exponent, plus one when any mantissa bit is set (DeepGEMM's ceil_to_ue8m0, FACTS (d))."""
    bits = x.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent.clamp(1, 254) << 23).view(torch.float32)


def e8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """Biased exponents of exact powers of two, as uint8."""
    bits = scale.float().contiguous().view(torch.int32)
    assert bool(((bits & 0x7FFFFF) == 0).all()), "not a power of two"
    return ((bits >> 23) & 0xFF).to(torch.uint8)


def e8m0_decode(b: torch.Tensor) -> torch.Tensor:
    """2^(byte - 127) in fp32 (FACTS (b)); 0xFF is NaN."""
    e = b.to(torch.int32)
    out = torch.pow(torch.tensor(2.0, dtype=torch.float64), (e - E8M0_BIAS).double()).float()
    return torch.where(e == 255, torch.tensor(float("nan")), out)


def as_e8m0(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.uint8).view(torch.float8_e8m0fnu)


def _pad_to(w: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    n, k = w.shape
    out = torch.zeros((-(-n // rows) * rows, -(-k // cols) * cols), dtype=w.dtype)
    out[:n, :k] = w
    return out


def quantize_fp8_blocks(
    w: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 e4m3 codes [N, K] and E8M0 scale bytes [ceil(N/r), ceil(K/c)] of a [N, K] weight: one
    scale per [r, c] block (partial edge blocks are zero-padded), 2^ceil(log2(amax / 448))."""
    r, c = block
    n, k = w.shape
    padded = _pad_to(w.float(), r, c)
    grid = padded.view(padded.shape[0] // r, r, padded.shape[1] // c, c)
    amax = grid.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale = ceil_pow2(amax / FP8_MAX)
    expanded = scale.repeat_interleave(r, 0).repeat_interleave(c, 1)[:n, :k]
    codes = (w.float() * (1.0 / expanded)).to(torch.float8_e4m3fn)
    return codes, e8m0_bytes(scale)


def dequantize_fp8_blocks(
    codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """Codes times the (decoded, fp32) scale of their [r, c] block."""
    n, k = codes.shape
    r, c = block
    expanded = scale.float().repeat_interleave(r, 0).repeat_interleave(c, 1)[:n, :k]
    return codes.float() * expanded


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8) of values already divided by their scale (|v| <= 6 expected)."""
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8)
    for threshold, inclusive in E2M1_THRESHOLDS:
        code += (mag >= threshold if inclusive else mag > threshold).to(torch.uint8)
    sign = ((v < 0) & (code != 0)).to(torch.uint8) << 3  # -0 is written as 0x0
    return code | sign


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    c = code.to(torch.int64)
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes -> [N, K/2] int8: input 2j in the low nibble of byte j, 2j+1 in the high."""
    pairs = codes.view(codes.shape[0], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.int8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed e2m1 [N, K/2] (int8) and E8M0 scale bytes [N, K/32] of a [N, K] weight: one scale
    per 32 inputs of a row, 2^ceil(log2(amax / 6))."""
    n, k = w.shape
    assert k % MXFP4_GROUP == 0, k
    groups = w.float().view(n, k // MXFP4_GROUP, MXFP4_GROUP)
    scale = ceil_pow2(groups.abs().amax(dim=-1).clamp(min=1e-4) / FP4_MAX)
    codes = e2m1_codes(groups * (1.0 / scale[..., None])).view(n, k)
    return pack_e2m1(codes), e8m0_bytes(scale)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    values = e2m1_decode(unpack_e2m1(packed))
    return values * scale.float().repeat_interleave(MXFP4_GROUP, dim=1)


def fake_quantize_activations(x: torch.Tensor, group: int) -> torch.Tensor:
    """DeepSeek's dynamic FP8 activation quantization, dequantized back to fp32 (DeepGEMM
    per_token_cast_to_fp8 with use_ue8m0, FACTS (d)): along the last dim, groups of `group`
    (the last one zero-padded), scale 2^ceil(log2(max(amax, 1e-4) / 448)), values x * (1/scale)
    rounded to e4m3 (nearest even)."""
    shape = x.shape
    k = shape[-1]
    flat = x.float().reshape(-1, k)
    padded = torch.zeros((flat.shape[0], -(-k // group) * group))
    padded[:, :k] = flat
    groups = padded.view(flat.shape[0], -1, group)
    scale = ceil_pow2(groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / FP8_MAX)
    q = (groups * (1.0 / scale)).to(torch.float8_e4m3fn).float() * scale
    return q.view(flat.shape[0], -1)[:, :k].reshape(shape).to(x.dtype)


# ---- Names --------------------------------------------------------------------------------------


def kind_of(name: str, experts: str) -> str:
    """How DeepSeek ships the tensor with original name `name`: fp8, fp4, f32, bf16 or int."""
    if _ROUTED_EXPERT.fullmatch(name):
        return "fp4" if experts == "fp4" else "fp8"
    if _FP8_DENSE.fullmatch(name):
        return "fp8"
    if name.endswith("tid2eid"):
        return "int"
    if _F32_DENSE.search(name):
        return "f32"
    return "bf16"


# ---- Models -------------------------------------------------------------------------------------

# transformers parameters of the GEMM weights DeepSeek quantizes (the compressors' own kv/gate
# projections stay bf16, so kv_proj is matched only directly under self_attn).
_TF_QUANTIZED = re.compile(
    r"model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_proj|o_a_proj|o_b_proj)|"
    r"self_attn\.compressor\.indexer\.q_b_proj|mlp\.shared_experts\.(gate|up|down)_proj)\.weight"
    r"|model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)"
)


def make_quantizable_model(config_kwargs: dict, seed: int) -> DeepseekV4ForCausalLM:
    """v4_reference.make_model with the quantized weights' magnitudes varied by row and by column
    (factors 2^u, u uniform in [-1.5, 1.5] per row and [-1, 1] per column): i.i.d. weights would
    give every block the same power-of-two scale, and a test could not tell blocks apart."""
    model = ref.make_model(config_kwargs, seed)
    gen = torch.Generator().manual_seed(seed + 2000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not _TF_QUANTIZED.fullmatch(name):
                continue
            rows = torch.exp2(torch.rand(p.shape[:-1], generator=gen) * 3 - 1.5)
            cols = torch.exp2(torch.rand(p.shape[-1], generator=gen) * 2 - 1)
            p.mul_(rows[..., None] * cols)
    return model


# ---- Writer -------------------------------------------------------------------------------------


@dataclass
class QuantSpec:
    block: tuple[int, int] = (128, 128)  # weight_block_size [rows, cols]
    experts: str = "fp4"  # "fp4": MXFP4 routed experts; "fp8": like the other GEMM weights
    spelling: str = "deepseek"  # "deepseek" (original names) or "transformers"
    # The tensors DeepSeek ships in bf16 (embedding, head, compressors, router, ...): "bf16" as
    # shipped, or "f32" to keep them exact, so a comparison of two backends isolates the
    # quantized formats from the bf16 GEMMs' activation rounding (tests/gpu).
    dense: str = "bf16"

    def __post_init__(self) -> None:
        assert self.experts in ("fp4", "fp8"), self.experts
        assert self.spelling in ("deepseek", "transformers"), self.spelling

    def activation_group(self, routed_expert: bool) -> int:
        """Activation group of the GEMMs: 32 in front of MXFP4 weights, else the block width."""
        return MXFP4_GROUP if routed_expert and self.experts == "fp4" else self.block[1]


@dataclass
class QuantizedCheckpoint:
    path: Path
    spec: QuantSpec
    reference: DeepseekV4ForCausalLM  # fp32, weights = the checkpoint's exact values
    tensors: dict[str, torch.Tensor]  # what model.safetensors holds, by the name written
    kinds: dict[str, str] = field(default_factory=dict)  # original name -> kind_of


def quantization_config(spec: QuantSpec) -> dict:
    q = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": list(spec.block),
        "activation_scheme": "dynamic",
    }
    if spec.experts == "fp4" and spec.spelling == "transformers":
        q["expert_dtype"] = "fp4"
    return q


def write_quantized_checkpoint(
    model: DeepseekV4ForCausalLM, path: Path, spec: QuantSpec
) -> QuantizedCheckpoint:
    """Writes `model` to `path` in `spec`'s format and builds the fp32 reference on the stored
    values (its dense checkpoint goes to `path`.parent / (`path`.name + "-reference"))."""
    work = path.parent / (path.name + "-reference")
    model.save_pretrained(str(work))
    saved = load_file(str(work / "model.safetensors"))
    config = json.loads((work / "config.json").read_text())

    tensors: dict[str, torch.Tensor] = {}
    exact: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    for name, w in saved.items():
        orig = ref.original_name(name)
        kind = kinds[orig] = kind_of(orig, spec.experts)
        out = orig if spec.spelling == "deepseek" else name
        base = out.removesuffix(".weight")
        scale_name = base + ".scale" if spec.spelling == "deepseek" else base + ".weight_scale_inv"
        if kind in ("fp8", "fp4"):
            if kind == "fp8":
                codes, scale = quantize_fp8_blocks(w, spec.block)
                exact[name] = dequantize_fp8_blocks(codes, e8m0_decode(scale), spec.block)
            else:
                codes, scale = quantize_mxfp4(w)
                exact[name] = dequantize_mxfp4(codes, e8m0_decode(scale))
            tensors[out] = codes
            tensors[scale_name] = (
                as_e8m0(scale) if spec.spelling == "deepseek" else e8m0_decode(scale)
            )
        elif kind == "int":
            tensors[out] = w
            exact[name] = w
        else:
            stored = w.float() if kind == "f32" or spec.dense == "f32" else w.to(torch.bfloat16)
            tensors[out] = stored.contiguous()
            exact[name] = stored.float()

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(spec)
    if spec.experts == "fp4" and spec.spelling == "deepseek":
        config["expert_dtype"] = "fp4"
    (path / "config.json").write_text(json.dumps(config, indent=2))

    save_file(
        {k: v.contiguous() for k, v in exact.items()},
        str(work / "model.safetensors"),
        metadata={"format": "pt"},
    )
    reference = DeepseekV4ForCausalLM.from_pretrained(str(work), dtype=torch.float32).eval()
    return QuantizedCheckpoint(path, spec, reference, tensors, kinds)


# ---- Activation emulation in the reference -------------------------------------------------------


class ActivationQuantHooks:
    """Context manager: while active, `model`'s forward quantizes the input of every GEMM whose
    weight the checkpoint quantizes, as DeepSeek's FP8 GEMMs do (fake_quantize_activations with
    the weight's activation group): attention q_a/q_b/kv/o_a (per output group: each group's
    slice is its own GEMM input)/o_b, the indexer's q_b, the shared expert's three projections,
    and the routed experts' gate_up input and their SwiGLU output (the down projection's input).
    `calls` counts the quantized GEMM inputs so a test can check every hook fired."""

    def __init__(self, model: DeepseekV4ForCausalLM, spec: QuantSpec) -> None:
        self.model = model
        self.spec = spec
        self.handles: list = []
        self.patched: list = []
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def _pre_hook(self, what: str, group: int):
        def hook(module, args):
            self._count(what)
            return (fake_quantize_activations(args[0], group), *args[1:])

        return hook

    def __enter__(self) -> ActivationQuantHooks:
        dense = self.spec.activation_group(routed_expert=False)
        routed = self.spec.activation_group(routed_expert=True)
        for layer in self.model.model.layers:
            attn = layer.self_attn
            linears = {
                "q_a_proj": attn.q_a_proj,
                "q_b_proj": attn.q_b_proj,
                "kv_proj": attn.kv_proj,
                "o_a_proj": attn.o_a_proj,  # input [..., groups, in/group]: per group slice
                "o_b_proj": attn.o_b_proj,
                "shared.gate_proj": layer.mlp.shared_experts.gate_proj,
                "shared.up_proj": layer.mlp.shared_experts.up_proj,
                "shared.down_proj": layer.mlp.shared_experts.down_proj,
            }
            indexer = getattr(attn.compressor, "indexer", None) if attn.compressor else None
            if indexer is not None:
                linears["indexer.q_b_proj"] = indexer.q_b_proj
            for what, module in linears.items():
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(what, dense)))
            experts = layer.mlp.experts
            self.handles.append(
                experts.register_forward_pre_hook(self._pre_hook("experts.gate_up", routed))
            )
            original = experts._apply_gate  # bound method of the class

            def apply_gate(gate_up, original=original):
                self._count("experts.down")
                return fake_quantize_activations(original(gate_up), routed)

            experts._apply_gate = apply_gate
            self.patched.append(experts)
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        for experts in self.patched:
            del experts._apply_gate
        self.handles.clear()
        self.patched.clear()
