"""kvcy's specs size pages as vLLM 0.33.0's do, for every quantization mode (no vLLM needed).

The expected values in tests/_spec_table.py were recorded from vLLM 0.33.0's own specs;
tests/vllm_live/test_vllm_specs.py recomputes them live where vLLM imports.
"""

from __future__ import annotations

import dataclasses

import pytest

from _spec_table import CUSTOMIZED, RECORDED, TABLE
from kvcy import kv_cache_interface as ki


def kvcy_spec(cls_name: str, kwargs: dict):
    kw = dict(kwargs)
    if "kv_quant_mode" in kw:
        kw["kv_quant_mode"] = ki.KVQuantMode[kw["kv_quant_mode"]]
    if "cache_role" in kw:
        kw["cache_role"] = ki.SparseCacheRole[kw["cache_role"]]
    return getattr(ki, cls_name)(**kw)


def geometry(spec) -> tuple[int, int, int]:
    return spec.num_heads, spec.state_content_size_bytes, spec.page_size_bytes


@pytest.mark.parametrize("name, cls_name, kwargs", TABLE, ids=[row[0] for row in TABLE])
def test_page_geometry_is_vllms(name, cls_name, kwargs):
    spec = kvcy_spec(cls_name, kwargs)
    assert geometry(spec) == RECORDED[name]
    if isinstance(spec, ki.AttentionSpec):
        assert spec.unpadded_page_size_bytes == spec.real_page_size_bytes
        assert spec.unpadded_page_size_bytes == spec.num_heads * spec.num_states * spec.state_content_size_bytes


@pytest.mark.parametrize("name, cls_name, kwargs", TABLE, ids=[row[0] for row in TABLE])
def test_customize_spec_is_the_default_backends_layout(name, cls_name, kwargs):
    spec = kvcy_spec(cls_name, kwargs)
    if not isinstance(spec, ki.AttentionSpec):
        return
    packed = ki.customize_spec(spec)
    if name in CUSTOMIZED:
        assert geometry(packed) == CUSTOMIZED[name]
        assert ki.customize_spec(packed) is packed  # published once: a packed spec is kept
    else:
        assert packed is spec


def test_every_vllm_quant_mode_is_accepted_and_sized_by_its_fields():
    for mode in ki.KVQuantMode:
        spec = ki.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="uint8", kv_quant_mode=mode)
        assert spec.page_size_bytes == 16 * 2 * 128
        packed = dataclasses.replace(spec, state_content_bytes=40, num_head_slots=3)
        assert packed.page_size_bytes == 16 * 3 * 40


def test_quant_modes_are_vllms():
    values = {m.name: m.value for m in ki.KVQuantMode}
    assert values == {
        "NONE": 0, "FP8_PER_TENSOR": 1, "INT8_PER_TOKEN_HEAD": 2, "FP8_PER_TOKEN_HEAD": 3,
        "INT4_PER_TOKEN_HEAD": 4, "NVFP4": 5, "TURBOQUANT_K8V4": 6, "TURBOQUANT_4BIT_NC": 7,
        "TURBOQUANT_K3V4_NC": 8, "TURBOQUANT_3BIT_NC": 9, "NVFP4_DS_MLA": 10, "ULTRAQUANT_4BIT": 11,
        "OCTAVE_K3V4": 12, "OCTAVE_K3V3": 13, "OCTAVE_K3V3_COMPACT": 14,
    }
    # as in vLLM, CUSTOM shares OCTAVE_K3V4's value, so it is that member
    assert ki.KVQuantMode.CUSTOM is ki.KVQuantMode.OCTAVE_K3V4
    assert ki.KVQuantMode.CUSTOM.is_custom_mode and ki.KVQuantMode.CUSTOM.is_octave
    assert [m.name for m in ki.KVQuantMode if m.is_turboquant] == [
        "TURBOQUANT_K8V4", "TURBOQUANT_4BIT_NC", "TURBOQUANT_K3V4_NC", "TURBOQUANT_3BIT_NC"]
    assert [m.name for m in ki.KVQuantMode if m.is_octave] == ["OCTAVE_K3V4", "OCTAVE_K3V3", "OCTAVE_K3V3_COMPACT"]
    assert [m.name for m in ki.KVQuantMode if m.is_ultraquant] == ["ULTRAQUANT_4BIT"]
    assert [m.name for m in ki.KVQuantMode if m.is_nvfp4] == ["NVFP4"]


@pytest.mark.parametrize(
    "name, mode",
    [("nvfp4_ds_mla", "NVFP4_DS_MLA"), ("nvfp4", "NVFP4"), ("nvfp4_4over6", "NVFP4"),
     ("turboquant_k8v4", "TURBOQUANT_K8V4"), ("turboquant_3bit_nc", "TURBOQUANT_3BIT_NC"),
     ("octave_k3v3_compact", "OCTAVE_K3V3_COMPACT"), ("ultraquant_4bit", "ULTRAQUANT_4BIT"),
     ("int4_per_token_head", "INT4_PER_TOKEN_HEAD"), ("fp8_e5m2", "FP8_PER_TENSOR"), ("auto", "NONE")],
)
def test_cache_dtype_names_map_as_in_vllm(name, mode):
    assert ki.get_kv_quant_mode(name) is ki.KVQuantMode[mode]
    if name != "auto":
        assert ki.get_dtype_size(name) == 1


def test_unknown_turboquant_name_is_a_key_error_as_in_vllm():
    with pytest.raises(KeyError):
        ki.get_kv_quant_mode("turboquant_9bit")


def test_packed_fields_are_checked():
    base = dict(block_size=16, num_kv_heads=2, head_size=64, dtype="float16")
    for field in ("num_head_slots", "state_content_bytes"):
        with pytest.raises(ValueError, match=field):
            ki.FullAttentionSpec(**base, **{field: 0})
        with pytest.raises(TypeError, match=field):
            ki.FullAttentionSpec(**base, **{field: 2.0})
    # a padded page smaller than the packed page
    with pytest.raises(ValueError, match="page_size_padded"):
        ki.FullAttentionSpec(**base, state_content_bytes=300, page_size_padded=16 * 2 * 256)
