"""``kvcy plan`` (kvcy.plan): presets, custom models, the table, JSON and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvcy import plan as plan_mod
from kvcy.plan import (
    FullLayer,
    MambaLayer,
    ModelDescription,
    build_kv_cache_spec,
    interleave_layers,
    load_presets,
    make_plan,
)

GiB = 1 << 30
MiB = 1 << 20


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = plan_mod.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> dict:
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------


def test_presets_are_data():
    presets = load_presets()
    assert {"llama-3-8b", "gemma-3-27b", "llama-4-scout", "deepseek-v3", "mamba-hybrid-8b"} <= set(presets)
    for name, data in presets.items():
        model = ModelDescription.from_dict(name, data)
        assert model.layers and model.description


def test_llama_3_8b(capsys):
    plan = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB")
    # page: 16 tokens x 8 heads x (128 + 128) x 2 bytes = 64 KiB; 20 GiB / 64 KiB / 32 layers
    assert plan["num_blocks"] == 10240
    assert plan["usable_blocks"] == 10239
    assert plan["num_tokens"] == 10240 * 16
    # 8192 / 16 = 512 blocks per request
    assert plan["groups"][0]["blocks_per_request"] == 512
    assert plan["max_concurrency"] == 20.0
    assert plan["kv_bytes_per_token"] == 32 * 8 * 256 * 2


def test_gemma_3_27b(capsys):
    plan = run_json(capsys, "--preset", "gemma-3-27b", "--memory", "20GiB")
    # 62 layers, every 6th full: 10 full and 52 sliding-window layers; group size 10,
    # 52 sliding layers -> cdiv(52, 10) = 6 groups taking every 6th: 9, 9, 9, 9, 8, 8
    assert [g["num_layers"] for g in plan["groups"]] == [9, 9, 9, 9, 8, 8, 10]
    assert [g["kind"] for g in plan["groups"]] == ["sliding_window"] * 6 + ["full_attention"]
    # page: 16 x 16 heads x 256 x 2 = 128 KiB; 20 GiB / 128 KiB / 10 pools
    assert plan["groups"][0]["page_size_bytes"] == 131072
    assert plan["num_blocks"] == 16384
    # one placement per group, all in one allocation of 10 layer regions (LBNHC)
    assert len(plan["kv_cache_tensors"]) == 7
    assert plan["allocated_bytes"] == 16384 * 10 * 131072
    assert {(t["layer_stride"], t["block_stride"], t["offset"]) for t in plan["kv_cache_tensors"]} == {
        (16384 * 131072, 131072, 0)
    }
    # per request: full 131072 / 16 = 8192; sliding cdiv(1023 + 2048, 16) + 1 = 193 each
    assert plan["groups"][0]["blocks_per_request"] == 193
    assert plan["max_concurrency"] == pytest.approx(16384 / (8192 + 6 * 193))
    assert plan["num_tokens"] == 16384 // 7 * 16


def test_llama_4_scout(capsys):
    plan = run_json(capsys, "--preset", "llama-4-scout", "--memory", "20GiB")
    # 36 chunked + 12 full, group size 12 -> 3 chunked groups + 1 full group
    assert [g["num_layers"] for g in plan["groups"]] == [12, 12, 12, 12]
    assert plan["num_blocks"] == 20 * GiB // 65536 // 12 == 27306
    # chunked: cdiv(min(8192 + 2048, 131072), 16) = 640 blocks; full: 8192
    assert plan["groups"][0]["blocks_per_request"] == 640
    assert plan["max_concurrency"] == pytest.approx(27306 / (8192 + 3 * 640))


def test_deepseek_v3_mla(capsys):
    plan = run_json(capsys, "--preset", "deepseek-v3", "--memory", "20GiB")
    # 64 tokens x 576 x 2 bytes = 72 KiB per layer
    assert plan["groups"][0]["page_size_bytes"] == 64 * 576 * 2
    assert plan["groups"][0]["kind"] == "mla_attention"
    assert plan["num_blocks"] == 20 * GiB // (64 * 576 * 2) // 61 == 4774
    assert plan["max_concurrency"] == pytest.approx(4774 / (163840 // 64))


def test_mamba_hybrid(capsys):
    plan = run_json(capsys, "--preset", "mamba-hybrid-8b", "--memory", "20GiB")
    # Mamba state: 3 x 10240 x 2 + 128 x 64 x 128 x 4 = 4,255,744 bytes; attention: 4096 bytes/token
    # -> attention block 16 x cdiv(4255744, 16 x 4096) = 16 x 65 = 1040 tokens, page 1040 x 4096
    page = 1040 * 4096
    assert all(g["page_size_bytes"] == page for g in plan["groups"])
    assert plan["groups"][-1]["block_size"] == 1040
    # 24 Mamba + 4 attention layers: group size 4 -> 6 Mamba groups + 1 attention group, 4 pools
    assert [g["kind"] for g in plan["groups"]] == ["mamba"] * 6 + ["full_attention"]
    assert len(plan["kv_cache_tensors"]) == 7  # one per group, over 4 layer regions
    assert plan["num_blocks"] == 20 * GiB // page // 4 == 1260
    assert plan["allocated_bytes"] == 1260 * 4 * page
    # per request: cdiv(8192, 1040) = 8 attention blocks + 1 state per Mamba group
    assert plan["max_concurrency"] == pytest.approx(1260 / (8 + 6))


def test_table_output(capsys):
    rc, out, _ = run(capsys, "--preset", "llama-3-8b", "--memory", "20GiB")
    assert rc == 0
    assert "kvcy plan: llama-3-8b" in out
    assert "10,240 (10,239 usable" in out
    assert "163,840 tokens" in out
    assert "20.00x requests of 8,192 tokens" in out
    assert "one LBNHC allocation of 20.00 GiB (2.00 MiB per block), 1 placement" in out


def test_list_presets(capsys):
    rc, out, _ = run(capsys, "--list-presets")
    assert rc == 0 and "gemma-3-27b" in out and "mamba-hybrid-8b" in out


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


def test_gpu_memory_budget(capsys):
    plan = run_json(capsys, "--preset", "llama-3-8b", "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.9",
                    "--model-memory", "16GiB")
    # 80 GiB x 0.9 - 16 GiB = 56 GiB
    assert plan["available_memory_bytes"] == 56 * GiB
    assert plan["num_blocks"] == 56 * GiB // 65536 // 32 == 28672


def test_fp8_halves_the_page(capsys):
    plan = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB", "--kv-cache-dtype", "fp8")
    assert plan["groups"][0]["page_size_bytes"] == 32768
    assert plan["num_blocks"] == 20480


def test_override_and_block_size(capsys):
    # the override is the capacity: 99 usable blocks hold one request of 99 x 16 tokens
    plan = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB", "--num-gpu-blocks-override", "100",
                    "--max-model-len", "1584")
    assert plan["num_blocks"] == 100
    assert plan["allocated_bytes"] == 100 * 65536 * 32
    plan = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB", "--block-size", "32")
    assert plan["groups"][0]["page_size_bytes"] == 131072
    assert plan["num_blocks"] == 5120


def test_disable_hybrid_manager(capsys):
    plan = run_json(capsys, "--preset", "gemma-3-27b", "--memory", "20GiB", "--max-model-len", "8192",
                    "--disable-hybrid-kv-cache-manager")
    assert [g["num_layers"] for g in plan["groups"]] == [62]
    assert plan["groups"][0]["sliding_window"] == 1024  # recorded on the full-attention spec
    assert plan["num_blocks"] == 20 * GiB // 131072 // 62 == 2642
    assert plan["max_concurrency"] == pytest.approx(2642 / 512)


def test_max_num_batched_tokens(capsys):
    plan = run_json(capsys, "--preset", "gemma-3-27b", "--memory", "20GiB", "--max-num-batched-tokens", "512")
    # cdiv(1023 + 512, 16) + 1 = 96 + 1
    assert plan["groups"][0]["blocks_per_request"] == 97


# ---------------------------------------------------------------------------
# Custom models
# ---------------------------------------------------------------------------


def test_custom_model_from_flags(capsys):
    plan = run_json(
        capsys, "--full-layers", "8", "--sliding-window-layers", "40", "--sliding-window", "4096",
        "--num-kv-heads", "8", "--head-size", "128", "--max-model-len", "32768", "--memory", "16GiB",
    )
    assert [g["num_layers"] for g in plan["groups"]] == [8, 8, 8, 8, 8, 8]
    assert plan["num_blocks"] == 16 * GiB // 65536 // 8 == 32768
    # full 32768 / 16 = 2048; sliding cdiv(4095 + 2048, 16) + 1 = 385, five groups
    assert plan["max_concurrency"] == pytest.approx(32768 / (2048 + 5 * 385))


def test_custom_model_from_file(capsys, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({
        "description": "two full layers",
        "max_model_len": 160,
        "dtype": "float16",
        "block_size": 16,
        "attention": {"full": {"kind": "full", "num_kv_heads": 2, "head_size": 64}},
        "layers": ["full", "full"],
    }))
    plan = run_json(capsys, "--model", str(path), "--memory", str(2 * 4096 * 30))
    # page 16 tokens x 2 heads x (64 + 64) x 2 bytes = 8192; 245760 bytes / 8192 / 2 layers = 15 blocks
    assert plan["groups"][0]["page_size_bytes"] == 8192
    assert plan["model"] == "tiny"
    assert plan["num_blocks"] == 15
    assert plan["max_concurrency"] == 1.5  # 160 / 16 = 10 blocks per request


def test_interleave_layers():
    assert interleave_layers({"full": 1, "sw": 5}) == ["sw", "sw", "sw", "sw", "sw", "full"]
    assert interleave_layers({"full": 2, "sw": 2}) == ["full", "sw", "full", "sw"]


def test_build_kv_cache_spec_names_layers():
    model = ModelDescription.from_dict("m", {
        "max_model_len": 64, "attention": {"a": {"kind": "full", "num_kv_heads": 1, "head_size": 8}},
        "num_layers": 3, "layer_pattern": ["a"],
    })
    specs = build_kv_cache_spec(model)
    assert list(specs) == ["layers.0", "layers.1", "layers.2"]
    assert specs["layers.0"].page_size_bytes == 16 * 1 * 16 * 2


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_too_little_memory_exits_1_with_the_estimate(capsys):
    rc, _, err = run(capsys, "--preset", "llama-3-8b", "--memory", "512MiB")
    assert rc == 1
    # 512 MiB = 256 blocks of 32 layers x 64 KiB; less the null block:
    # cdiv(L, 16) <= 255  ->  L = 4080
    assert "estimated maximum model length is 4080" in err


@pytest.mark.parametrize("block_size", [16.0, True, "16"])
def test_build_kv_cache_spec_refuses_a_block_size_of_the_wrong_type_as_make_plan_does(block_size):
    # build_kv_cache_spec said ValueError where make_plan (CacheConfig) says TypeError
    model = ModelDescription.from_dict("llama-3-8b", load_presets()["llama-3-8b"])
    with pytest.raises(TypeError, match="block_size must be an int or None"):
        build_kv_cache_spec(model, "auto", block_size)
    with pytest.raises(TypeError, match="block_size must be an int or None"):
        make_plan(model, GiB, block_size=block_size)
    with pytest.raises(ValueError, match="block_size must be positive"):
        build_kv_cache_spec(model, "auto", 0)


def test_make_plan_raises_value_error():
    model = ModelDescription.from_dict("llama-3-8b", load_presets()["llama-3-8b"])
    with pytest.raises(ValueError, match="estimated maximum model length is 4080"):
        make_plan(model, 512 * MiB)
    with pytest.raises(ValueError, match="No available memory"):
        make_plan(model, 0)
    with pytest.raises(ValueError, match="block_size must be positive"):
        make_plan(model, GiB, block_size=0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "nope", "--memory", "1G"], "unknown preset 'nope'"),
        (["--preset", "llama-3-8b"], "--kv-memory SIZE, or --gpu-memory SIZE"),
        (["--preset", "llama-3-8b", "--memory", "lots"], "not a memory size"),
        (["--preset", "llama-3-8b", "--memory", "1G", "--block-size", "0"], "expected a positive integer, got '0'"),
        (["--preset", "llama-3-8b", "--memory", "1G", "--gpu-memory", "2G"], "not both"),
        (["--sliding-window-layers", "4", "--num-kv-heads", "8", "--head-size", "64", "--max-model-len", "64",
          "--memory", "1G"], "needs --sliding-window"),
        (["--full-layers", "4", "--head-size", "64", "--max-model-len", "64", "--memory", "1G"], "--num-kv-heads"),
        (["--memory", "1G"], "layer counts"),
        (["--preset", "llama-3-8b", "--memory", "1G", "--gpu-memory-utilization", "1.5"],
         "expected a number in (0, 1]"),
        (["--preset", "llama-3-8b", "--memory", "1G", "--dtype", "float13"], "unknown dtype"),
    ],
)
def test_bad_arguments_exit_2(capsys, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert message in err


@pytest.mark.parametrize(
    "data, message",
    [
        ({"max_model_len": 64, "attention": {}, "layers": ["a"]},
         r"Expected `object` of length >= 1 - at `\$\.attention`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "full", "num_kv_heads": 1, "head_size": 8}},
          "layers": ["b"]}, "not described"),
        ({"max_model_len": 0, "attention": {"a": {"kind": "full", "num_kv_heads": 1, "head_size": 8}},
          "layers": ["a"]}, r"model 'bad': Expected `int` >= 1 - at `\$\.max_model_len`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "full", "num_kv_heads": 0, "head_size": 8}},
          "layers": ["a"]}, r"attention\['a'\]: Expected `int` >= 1 - at `\$\.num_kv_heads`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "sliding_window", "num_kv_heads": 1, "head_size": 8}},
          "layers": ["a"]}, r"attention\['a'\]: Object missing required field `sliding_window`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "conv", "head_size": 8}}, "layers": ["a"]},
         r"attention\['a'\]: Invalid value 'conv' - at `\$\.kind`"),
        # msgspec does the type checks: no bool or string passes for an integer
        ({"max_model_len": True, "attention": {"a": {"kind": "mla", "head_size": 8}}, "layers": ["a"]},
         r"Expected `int`, got `bool` - at `\$\.max_model_len`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "mla", "head_size": "8"}}, "layers": ["a"]},
         r"Expected `int`, got `str` - at `\$\.head_size`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "mamba", "shapes": [[4, 0]], "dtypes": ["float32"]}},
          "layers": ["a"]}, r"Expected `int` >= 1 - at `\$\.shapes\[0\]\[1\]`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "mla", "head_size": 8}}, "layers": []},
         r"Expected `array` of length >= 1 - at `\$\.layers`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "mla", "head_size": 8}}, "layers": ["a"],
          "dtype": "float13"}, "dtype: unknown dtype 'float13'"),
        ([1, 2], r"model 'bad': Expected `object`, got `array`"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "mamba", "shapes": [[4]], "dtypes": []}},
          "layers": ["a"]}, "dtypes"),
        ({"max_model_len": 64, "attention": {"a": {"kind": "full", "num_kv_heads": 1, "head_size": 8}},
          "num_layers": 4}, "layer_pattern"),
    ],
)
def test_bad_model_descriptions(data, message):
    with pytest.raises(ValueError, match=message):
        ModelDescription.from_dict("bad", data)


def test_bad_model_file_exits_2(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    rc, _, err = run(capsys, "--model", str(path), "--memory", "1G")
    assert rc == 2 and "cannot read model description" in err
    path.write_text(json.dumps({"max_model_len": 64, "attention": {"a": {"kind": "full", "head_size": 8}},
                                "layers": ["a"]}))
    rc, _, err = run(capsys, "--model", str(path), "--memory", "1G")
    # the file, the layer type and msgspec's path to the field
    assert rc == 2 and f"model description {str(path)!r}: attention['a']: Object missing required field " \
        "`num_kv_heads`" in err
    rc, _, err = run(capsys, "--model", str(tmp_path / "absent.json"), "--memory", "1G")
    assert rc == 2 and "cannot read model description" in err and "No such file" in err


def test_model_file_reads_like_its_dict(tmp_path):
    preset = load_presets()["mamba-hybrid-8b"]
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(preset))
    from_file = ModelDescription.from_json(path)
    assert from_file.name == "hybrid"
    assert from_file.attention == ModelDescription.from_dict("hybrid", preset).attention
    assert isinstance(from_file.attention["mamba"], MambaLayer) and isinstance(from_file.attention["full"], FullLayer)
    assert from_file.attention["mamba"].shapes == [[3, 10240], [128, 64, 128]]


def test_cli_dispatch_and_module_entry_point():
    from kvcy.cli import main as cli_main

    assert cli_main(["plan", "--list-presets"]) == 0
    result = subprocess.run(
        [sys.executable, "-m", "kvcy", "plan", "--preset", "llama-3-8b", "--memory", "20GiB", "--json"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_blocks"] == 10240


# ---------------------------------------------------------------------------
# The memory budget and the exit status
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        # not one block per layer: a bad budget (exit 2, as replay's --kv-memory 1MiB), not "does not fit" (1)
        (["--preset", "llama-3-8b", "--kv-memory", "1KiB"], "a KV-cache budget of 1.00 KiB is too small"),
        (["--preset", "llama-3-8b", "--gpu-memory", "1KiB"], "a KV-cache budget of 921 B is too small"),
        (["--preset", "llama-3-8b", "--gpu-memory", "10GiB", "--model-memory", "20GiB"],
         "--model-memory 20.00 GiB leaves nothing for the KV cache: --gpu-memory 10.00 GiB x 0.9 is 9.00 GiB"),
        (["--preset", "llama-3-8b", "--gpu-memory", "10GiB", "--model-memory", "9GiB"], "leaves nothing"),
        (["--preset", "llama-3-8b", "--kv-memory", "10GiB", "--model-memory", "9GiB"],
         "--model-memory goes with --gpu-memory"),
        (["--preset", "llama-3-8b", "--kv-memory", "20GiB", "--full-layers", "3"],
         "layer flags (--full-layers) describe a model, and --preset llama-3-8b describes one already"),
        (["--preset", "llama-3-8b", "--kv-memory", "20GiB", "--num-kv-heads", "4", "--head-size", "64"],
         "layer flags (--num-kv-heads, --head-size)"),
        (["--preset", "llama-3-8b", "--kv-memory", "20GiB", "--num-gpu-blocks-override", "1"],
         "expected an integer >= 2 (block 0 is the null block), got '1'"),
    ],
)
def test_bad_budgets_and_ignored_flags_exit_2(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert message in err


def test_a_model_file_with_layer_flags_exits_2(capsys, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(load_presets()["llama-3-8b"]))
    rc, _, err = run(capsys, "--model", str(path), "--kv-memory", "20GiB", "--sliding-window", "128")
    assert rc == 2 and f"--model {path} describes one already" in err


def test_gpu_memory_without_model_memory_says_what_it_assumed(capsys):
    rc, out, err = run(capsys, "--preset", "llama-3-8b", "--gpu-memory", "40GiB")
    assert rc == 0
    assert "= GPU 40.00 GiB x 0.9 - model 0 B (assumed: give --model-memory)" in out
    assert "no --model-memory given" in err and "as if the weights took no memory" in err
    plan = run_json(capsys, "--preset", "llama-3-8b", "--gpu-memory", "40GiB")
    assert plan["memory_budget"] == {
        "gpu_memory_bytes": 40 * GiB, "gpu_memory_utilization": 0.9, "model_memory_bytes": 0,
        "model_memory_assumed": True,
    }
    plan = run_json(capsys, "--preset", "llama-3-8b", "--gpu-memory", "40GiB", "--model-memory", "16GiB")
    assert plan["memory_budget"]["model_memory_assumed"] is False
    assert plan["available_memory_bytes"] == 36 * GiB - 16 * GiB
    rc, out, err = run(capsys, "--preset", "llama-3-8b", "--gpu-memory", "40GiB", "--model-memory", "16GiB")
    assert "- model 16.00 GiB\n" in out and "assumed" not in out + err
    assert "memory_budget" not in run_json(capsys, "--preset", "llama-3-8b", "--kv-memory", "20GiB")


def test_does_not_fit_is_said_in_kvcy_words(capsys):
    rc, out, err = run(capsys, "--preset", "llama-3-8b", "--kv-memory", "512MiB", "--json")
    assert rc == 1
    assert "One request of max_model_len (8192) does not fit" in err
    assert "models's" not in err and "engine" not in err and "gpu_memory_utilization" not in err
    assert "estimated maximum model length is 4080" in json.loads(out)["error"]


def test_override_of_two_blocks_is_the_smallest_plan(capsys):
    plan = run_json(capsys, "--preset", "llama-3-8b", "--kv-memory", "20GiB", "--num-gpu-blocks-override", "2",
                    "--max-model-len", "16")
    assert plan["num_blocks"] == 2 and plan["usable_blocks"] == 1
    # as in vLLM 0.33.0 the override is the capacity the memory check sees: one usable block
    # does not hold a request of 17 tokens
    rc, _, err = run(capsys, "--preset", "llama-3-8b", "--kv-memory", "20GiB", "--num-gpu-blocks-override", "2",
                     "--max-model-len", "17")
    assert rc == 1 and "estimated maximum model length is 16" in err


def test_kv_cache_layout_sets_the_strides(capsys):
    plan = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB", "--kv-cache-layout", "BLHNC")
    assert plan["kv_cache_layout"] == "BLHNC" and plan["num_blocks"] == 10240
    # block-outermost: a block holds the 32 layers' pages side by side
    (tensor,) = plan["kv_cache_tensors"]
    assert (tensor["layer_stride"], tensor["block_stride"], tensor["offset"]) == (65536, 32 * 65536, 0)
    default = run_json(capsys, "--preset", "llama-3-8b", "--memory", "20GiB")
    assert default["kv_cache_layout"] == "LBNHC"
    assert default["kv_cache_tensors"][0]["layer_stride"] == 10240 * 65536
    rc, _, err = run(capsys, "--preset", "llama-3-8b", "--memory", "20GiB", "--kv-cache-layout", "XYZ")
    assert rc == 2 and "--kv-cache-layout" in err


@pytest.mark.parametrize(
    "kind, cache_dtype, geometry",
    [
        ("full", "int8_per_token_head", (8, 128 + 128 + 8)),  # Triton: K, V and two fp32 scales per state
        ("full", "fp8_per_token_head", (8, 128 + 128 + 8)),
        ("full", "nvfp4", (16, 64 + 8)),  # FlashInfer: K and V slots of fp4 data + fp8 block scales
        ("full", "fp8", (8, 256)),
        ("mla", "fp8_ds_mla", (1, 656)),  # the opaque sparse-MLA blob vLLM's MLA layer publishes
        ("mla", "int8_per_token_head", (1, 128 + 8)),  # latent + the scale pair
    ],
)
def test_build_kv_cache_spec_uses_the_backends_packed_layouts(kind, cache_dtype, geometry):
    # page sizes follow vLLM's fields-only formula, so the plan publishes what vLLM's default
    # backend for the mode would (kvcy.kv_cache_interface.customize_spec)
    layer = {"kind": kind, "head_size": 128, **({"num_kv_heads": 8} if kind == "full" else {})}
    model = ModelDescription.from_dict("m", {
        "max_model_len": 64, "attention": {"a": layer}, "num_layers": 1, "layer_pattern": ["a"],
    })
    spec = build_kv_cache_spec(model, cache_dtype)["layers.0"]
    assert (spec.num_heads, spec.state_content_size_bytes) == geometry
    assert spec.page_size_bytes == spec.block_size * geometry[0] * geometry[1]
