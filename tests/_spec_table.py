"""A table of KV-cache specs with the page geometry vLLM 0.33.0 gives them.

Each row: an id, the spec class name (the same in vLLM and kvcy), keyword arguments with the
dtype as a name and enums (``kv_quant_mode``, ``cache_role``) as member names, and the
``(num_heads, state_content_size_bytes, page_size_bytes)`` vLLM 0.33.0's spec reported for it,
recorded with /tmp/kvh-venv's vLLM.  ``CUSTOMIZED`` holds the same triple after the default
backend's ``customize_spec`` (Triton for per-token-head modes, the MLA backends for MLA; the
NVFP4 row is FlashInfer's layout, written out as ``full-nvfp4-packed``).  tests/test_spec_pages.py
checks kvcy against the recorded values; tests/vllm_live/test_vllm_specs.py checks them against live vLLM.
"""

from __future__ import annotations

from fractions import Fraction

#: (id, class name, keyword arguments); dtypes and enum members by name.
TABLE = [
    ("full-bf16", "FullAttentionSpec", dict(block_size=16, num_kv_heads=8, head_size=128, dtype='bfloat16')),
    ("full-v128", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=192, head_size_v=128, dtype='float16'
    )),
    ("full-fp8", "FullAttentionSpec", dict(
        block_size=32, num_kv_heads=2, head_size=128, dtype='uint8', kv_quant_mode='FP8_PER_TENSOR'
    )),
    ("full-int8-pth", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='int8', kv_quant_mode='INT8_PER_TOKEN_HEAD'
    )),
    ("full-int8-pth-packed", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='int8', kv_quant_mode='INT8_PER_TOKEN_HEAD',
        state_content_bytes=264
    )),
    ("full-fp8-pth", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=64, dtype='uint8', kv_quant_mode='FP8_PER_TOKEN_HEAD'
    )),
    ("full-int4-pth", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=128, dtype='uint8', kv_quant_mode='INT4_PER_TOKEN_HEAD'
    )),
    ("full-int4-pth-packed", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=128, dtype='uint8', kv_quant_mode='INT4_PER_TOKEN_HEAD',
        state_content_bytes=136
    )),
    ("full-nvfp4", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='uint8', kv_quant_mode='NVFP4'
    )),
    ("full-nvfp4-packed", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='uint8', kv_quant_mode='NVFP4', num_head_slots=16,
        state_content_bytes=72
    )),
    ("full-turboquant", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='uint8', kv_quant_mode='TURBOQUANT_K8V4',
        state_content_bytes=196
    )),
    ("full-octave", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=128, dtype='uint8', kv_quant_mode='OCTAVE_K3V3',
        state_content_bytes=100
    )),
    ("full-ultraquant", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=128, dtype='uint8', kv_quant_mode='ULTRAQUANT_4BIT',
        state_content_bytes=136
    )),
    ("full-custom", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=128, dtype='uint8', kv_quant_mode='CUSTOM'
    )),
    ("full-padded", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=8, head_size=128, dtype='bfloat16', page_size_padded=70000
    )),
    ("full-fraction", "FullAttentionSpec", dict(
        block_size=16, num_kv_heads=2, head_size=64, dtype='float16', tokens_per_state=Fraction(1, 2)
    )),
    ("sliding-int8-pth", "SlidingWindowSpec", dict(
        block_size=16, num_kv_heads=4, head_size=64, dtype='int8', kv_quant_mode='INT8_PER_TOKEN_HEAD',
        sliding_window=128
    )),
    ("chunked", "ChunkedLocalAttentionSpec", dict(
        block_size=16, num_kv_heads=4, head_size=64, dtype='float16', attention_chunk_size=256
    )),
    ("cross", "CrossAttentionSpec", dict(block_size=16, num_kv_heads=4, head_size=64, dtype='float16')),
    ("sink", "SinkFullAttentionSpec", dict(block_size=16, num_kv_heads=4, head_size=64, dtype='float16', sink_len=4)),
    ("mla", "MLAAttentionSpec", dict(block_size=16, num_kv_heads=1, head_size=576, dtype='bfloat16')),
    ("mla-2heads", "MLAAttentionSpec", dict(block_size=16, num_kv_heads=2, head_size=576, dtype='bfloat16')),
    ("mla-fp8-ds", "MLAAttentionSpec", dict(
        block_size=64, num_kv_heads=1, head_size=576, dtype='uint8', cache_dtype_str='fp8_ds_mla',
        state_content_bytes=656
    )),
    ("mla-nvfp4-ds", "MLAAttentionSpec", dict(
        block_size=64, num_kv_heads=1, head_size=576, dtype='uint8', cache_dtype_str='nvfp4_ds_mla',
        kv_quant_mode='NVFP4_DS_MLA', state_content_bytes=352
    )),
    ("mla-int8-pth", "MLAAttentionSpec", dict(
        block_size=16, num_kv_heads=1, head_size=576, dtype='int8', kv_quant_mode='INT8_PER_TOKEN_HEAD'
    )),
    ("mla-aligned", "MLAAttentionSpec", dict(
        block_size=64, num_kv_heads=1, head_size=584, dtype='uint8', alignment=4096, model_version='deepseek_v4',
        tokens_per_state=4, topk_buffer_width=2048
    )),
    ("mla-indexer", "MLAAttentionSpec", dict(
        block_size=64, num_kv_heads=1, head_size=132, dtype='uint8', cache_role='INDEXER',
        is_index_group_leader=True
    )),
    ("sliding-mla", "SlidingWindowMLASpec", dict(
        block_size=16, num_kv_heads=1, head_size=576, dtype='bfloat16', sliding_window=128
    )),
    ("sliding-mla-aligned", "SlidingWindowMLASpec", dict(
        block_size=64, num_kv_heads=1, head_size=584, dtype='uint8', sliding_window=128, alignment=576,
        model_version='deepseek_v4'
    )),
    ("mamba", "MambaSpec", dict(block_size=16, shapes=((4, 8), (2, 3)), dtypes=('float32', 'bfloat16'))),
    ("mamba-fields", "MambaSpec", dict(
        block_size=16, shapes=((3, 10240),), dtypes=('bfloat16',), num_prefill_checkpoint_blocks=2,
        prefill_checkpoint_alignment=64, tp_replicated=True, num_speculative_blocks=1
    )),
]

#: id -> (num_heads, state_content_size_bytes, page_size_bytes) of vLLM 0.33.0's spec.
RECORDED = {
    "full-bf16": (8, 512, 65536),
    "full-v128": (8, 640, 81920),
    "full-fp8": (2, 256, 16384),
    "full-int8-pth": (8, 256, 32768),
    "full-int8-pth-packed": (8, 264, 33792),
    "full-fp8-pth": (4, 128, 8192),
    "full-int4-pth": (4, 256, 16384),
    "full-int4-pth-packed": (4, 136, 8704),
    "full-nvfp4": (8, 256, 32768),
    "full-nvfp4-packed": (16, 72, 18432),
    "full-turboquant": (8, 196, 25088),
    "full-octave": (4, 100, 6400),
    "full-ultraquant": (4, 136, 8704),
    "full-custom": (4, 256, 16384),
    "full-padded": (8, 512, 70000),
    "full-fraction": (2, 256, 16384),
    "sliding-int8-pth": (4, 128, 8192),
    "chunked": (4, 256, 16384),
    "cross": (4, 256, 16384),
    "sink": (4, 256, 16384),
    "mla": (1, 1152, 18432),
    "mla-2heads": (2, 1152, 36864),
    "mla-fp8-ds": (1, 656, 41984),
    "mla-nvfp4-ds": (1, 352, 22528),
    "mla-int8-pth": (1, 576, 9216),
    "mla-aligned": (1, 584, 12288),
    "mla-indexer": (1, 132, 8448),
    "sliding-mla": (1, 1152, 18432),
    "sliding-mla-aligned": (1, 584, 37440),
    "mamba": (1, 140, 140),
    "mamba-fields": (1, 61440, 61440),
}

#: id -> the same triple after the default backend's customize_spec (rows it changes).
CUSTOMIZED = {
    "full-int8-pth": (8, 264, 33792),
    "full-fp8-pth": (4, 136, 8704),
    "full-int4-pth": (4, 136, 8704),
    "full-nvfp4": (16, 72, 18432),  # FlashInfer's layout (full-nvfp4-packed)
    "sliding-int8-pth": (4, 136, 8704),
    "mla-int8-pth": (1, 584, 9344),
}
