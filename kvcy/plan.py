"""``kvcy plan``: how many KV-cache blocks, tokens and max-length requests fit in memory.

A model is described by its layers' attention types (full, sliding window,
chunked local, MLA, Mamba), KV heads, head size, dtype and block size, either
from a preset kept as data (``kvcy/data/model_presets.json``), from a JSON file
in the same format, or from flags.  The plan is vLLM's: the same grouping,
padding, block count and concurrency as :func:`kvcy.kv_cache_sizing.get_kv_cache_config`.

Examples::

    kvcy plan --preset llama-3-8b --kv-memory 20GiB
    kvcy plan --preset llama-3-8b --gpu-memory 80GiB --model-memory 16GiB
    kvcy plan --full-layers 8 --sliding-window-layers 40 --sliding-window 4096 \\
        --num-kv-heads 8 --head-size 128 --max-model-len 32768 --kv-memory 16GiB --json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import msgspec

from kvcy.cli import float_arg, int_arg, parse_size, positive_int, size_arg
from kvcy.config import CACHE_DTYPES, CacheConfig, KVCacheSettings, _check_optional_positive_int
from kvcy.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheLayout,
    KVCacheSpec,
    KVQuantMode,
    MLA_PACKED_STATE_BYTES,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    canonical_dtype,
    cdiv,
    customize_spec,
    get_kv_cache_spec_kind,
    get_kv_quant_mode,
)
from kvcy.kv_cache_sizing import (
    NotEnoughKVCacheMemory,
    get_kv_cache_config,
    get_max_concurrency_for_kv_cache_config,
    get_num_tokens_for_kv_cache_config,
)

__all__ = [
    "ChunkedLocalLayer",
    "FullLayer",
    "LayerType",
    "MAX_MODEL_FILE_BYTES",
    "MLALayer",
    "MambaLayer",
    "ModelDescription",
    "SlidingWindowLayer",
    "add_parser",
    "build_kv_cache_spec",
    "load_presets",
    "main",
    "make_plan",
    "parse_size",
    "run",
]

#: Attention block sizes are kept a multiple of this when grown to fit a Mamba state.
KERNEL_BLOCK_ALIGNMENT = 16

#: The largest model description file read (a description is a few KB; a preset file is too).
MAX_MODEL_FILE_BYTES = 1 << 20


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


# ---------------------------------------------------------------------------
# Model descriptions
# ---------------------------------------------------------------------------


def load_presets() -> dict[str, dict[str, Any]]:
    """The bundled model presets by name, as JSON objects (read them with :meth:`ModelDescription.from_dict`)."""
    return msgspec.json.decode(resources.files("kvcy").joinpath("data/model_presets.json").read_bytes())


_PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
_NonEmptyNames = Annotated[list[str], msgspec.Meta(min_length=1)]


class _LayerType(msgspec.Struct, frozen=True, tag_field="kind"):
    """One layer type of a model description; the JSON object's ``kind`` picks the subclass."""


class FullLayer(_LayerType, frozen=True, tag="full"):
    """Full attention: ``num_kv_heads`` heads of ``head_size``."""

    num_kv_heads: _PositiveInt
    head_size: _PositiveInt


class SlidingWindowLayer(_LayerType, frozen=True, tag="sliding_window"):
    """Attention over the last ``sliding_window`` tokens."""

    num_kv_heads: _PositiveInt
    head_size: _PositiveInt
    sliding_window: _PositiveInt


class ChunkedLocalLayer(_LayerType, frozen=True, tag="chunked_local"):
    """Attention within ``attention_chunk_size``-token chunks."""

    num_kv_heads: _PositiveInt
    head_size: _PositiveInt
    attention_chunk_size: _PositiveInt


class MLALayer(_LayerType, frozen=True, tag="mla"):
    """Multi-head latent attention: one latent of ``head_size`` per token."""

    head_size: _PositiveInt


class MambaLayer(_LayerType, frozen=True, tag="mamba"):
    """A Mamba layer's state: one tensor per shape, each with its dtype."""

    shapes: Annotated[list[Annotated[list[_PositiveInt], msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
    dtypes: list[str]

    def __post_init__(self) -> None:
        if len(self.dtypes) != len(self.shapes):
            raise ValueError(f"a mamba layer needs as many 'dtypes' as 'shapes' ({len(self.shapes)}), "
                             f"got {len(self.dtypes)}")


#: A layer type of a model description, by its ``kind``.
LayerType = FullLayer | SlidingWindowLayer | ChunkedLocalLayer | MLALayer | MambaLayer


class _ModelFile(msgspec.Struct, frozen=True):
    """A model description as a preset or JSON file gives it (see :class:`ModelDescription`).

    ``attention`` values stay JSON objects here and are read one by one, so an
    error names the layer type it is in.
    """

    max_model_len: _PositiveInt
    attention: Annotated[dict[str, dict[str, Any]], msgspec.Meta(min_length=1)]
    description: str = ""
    dtype: str = "bfloat16"
    block_size: _PositiveInt = 16
    layers: _NonEmptyNames | None = None
    num_layers: _PositiveInt | None = None
    layer_pattern: _NonEmptyNames | None = None

    def __post_init__(self) -> None:
        if self.layers is None and (self.num_layers is None or self.layer_pattern is None):
            raise ValueError("give 'layers' or 'num_layers' with a non-empty 'layer_pattern'")
        try:
            canonical_dtype(self.dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"dtype: {exc}") from None


def _convert(data: Any, type_: Any, where: str) -> Any:
    """``msgspec.convert`` with a :class:`ValueError` that says where (``where``, then msgspec's path)."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass
class ModelDescription:
    """A model as far as its KV cache is concerned.

    Attributes:
        name: what to call it in the report.
        description: one line about it.
        max_model_len: longest request, in tokens.
        dtype: the model's dtype (the KV cache's with cache dtype "auto").
        block_size: tokens per block.
        attention: layer type name -> its :data:`LayerType` (in JSON, an
            object whose ``kind`` is ``full``, ``sliding_window`` (with
            ``sliding_window``), ``chunked_local`` (``attention_chunk_size``),
            ``mla`` or ``mamba`` (``shapes``, ``dtypes``); attention kinds
            take ``head_size`` and, but for MLA, ``num_kv_heads``).
        layers: the type name of every layer, in order.
    """

    name: str
    description: str
    max_model_len: int
    dtype: str
    block_size: int
    attention: dict[str, LayerType]
    layers: list[str]

    @classmethod
    def from_dict(cls, name: str, data: Any) -> ModelDescription:
        """Read and check a description (a preset or a JSON file's object).

        The layers are either ``"layers": [type, ...]`` or
        ``"num_layers": N`` with a ``"layer_pattern"`` repeated to N layers.
        msgspec checks the types and ranges (:class:`_ModelFile`, :data:`LayerType`).

        Raises:
            ValueError: a missing or bad field, named in the message with its JSON path.
        """
        where = f"model {name!r}"
        return cls._from_file(name, _convert(data, _ModelFile, where), where)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelDescription:
        """Read and check a JSON model description file; the model is named after the file.

        Raises:
            OSError: the file cannot be read.
            ValueError: not a regular file (a device such as /dev/zero would be read without end),
                larger than :data:`MAX_MODEL_FILE_BYTES`, not JSON, or a missing or bad field (the
                message names the file and the field).
        """
        path = Path(path)
        where = f"model description {str(path)!r}"
        if path.exists() and not path.is_file():
            raise ValueError(f"{where} is not a regular file")
        with open(path, "rb") as f:
            raw = f.read(MAX_MODEL_FILE_BYTES + 1)
        if len(raw) > MAX_MODEL_FILE_BYTES:
            raise ValueError(f"{where} is larger than {MAX_MODEL_FILE_BYTES:,} bytes: not a model description")
        try:
            data = msgspec.json.decode(raw, type=_ModelFile)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"cannot read {where}: {exc}") from None  # JSON is malformed: ...
        return cls._from_file(path.stem, data, where)

    @classmethod
    def _from_file(cls, name: str, data: _ModelFile, where: str) -> ModelDescription:
        attention = {
            type_name: _convert(params, LayerType, f"{where}: attention[{type_name!r}]")
            for type_name, params in data.attention.items()
        }
        if data.layers is not None:
            layers = list(data.layers)
        else:
            pattern = data.layer_pattern
            layers = [pattern[i % len(pattern)] for i in range(data.num_layers)]
        unknown = sorted(set(layers) - attention.keys())
        if unknown:
            raise ValueError(f"{where}: layer types {unknown} are not described under 'attention'")
        return cls(
            name=name,
            description=data.description,
            max_model_len=data.max_model_len,
            dtype=data.dtype,
            block_size=data.block_size,
            attention=attention,
            layers=layers,
        )


def interleave_layers(counts: dict[str, int]) -> list[str]:
    """Spread layer types evenly over the model (e.g. 8 full and 40 sliding: 1 full after every 5 sliding)."""
    slots = []
    for order, (type_name, count) in enumerate(counts.items()):
        slots.extend(((k + 1) / count, -count, order, type_name) for k in range(count))
    return [slot[-1] for slot in sorted(slots)]


# ---------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------


def _attention_dtype(model: ModelDescription, cache_dtype: str) -> tuple[str, KVQuantMode]:
    if cache_dtype == "auto":
        return model.dtype, KVQuantMode.NONE
    return cache_dtype, get_kv_quant_mode(cache_dtype)


def build_kv_cache_spec(
    model: ModelDescription, cache_dtype: str = "auto", block_size: int | None = None
) -> dict[str, KVCacheSpec]:
    """Each layer's spec, by layer name (``layers.<i>``).

    With Mamba and attention layers together, the attention block size grows
    (in steps of :data:`KERNEL_BLOCK_ALIGNMENT` tokens) until one attention
    page holds a Mamba state, and Mamba pages are padded to the attention
    page, so that all layers share one page size (as vLLM does for hybrid
    Mamba models without prefix caching).
    """
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"Unknown kv cache dtype: {cache_dtype}")
    _check_optional_positive_int("block_size", block_size)  # CacheConfig's check: make_plan refuses alike
    bs = model.block_size if block_size is None else block_size
    dtype, quant = _attention_dtype(model, cache_dtype)

    def attention_spec(params: LayerType, block: int) -> AttentionSpec:
        common = dict(block_size=block, head_size=params.head_size, dtype=dtype, kv_quant_mode=quant)
        if isinstance(params, MLALayer):
            mla_dtype = "uint8" if cache_dtype == "fp8_ds_mla" else dtype
            # vLLM's MLA layer publishes the opaque sparse-MLA formats' bytes per token;
            # the backend then its packed layout (customize_spec)
            return customize_spec(MLAAttentionSpec(
                **{**common, "dtype": mla_dtype},
                num_kv_heads=1,
                cache_dtype_str=cache_dtype if cache_dtype != "auto" else None,
                state_content_bytes=MLA_PACKED_STATE_BYTES.get(cache_dtype),
            ))
        common["num_kv_heads"] = params.num_kv_heads
        if isinstance(params, SlidingWindowLayer):
            return customize_spec(SlidingWindowSpec(**common, sliding_window=params.sliding_window))
        if isinstance(params, ChunkedLocalLayer):
            return customize_spec(ChunkedLocalAttentionSpec(**common, attention_chunk_size=params.attention_chunk_size))
        return customize_spec(FullAttentionSpec(**common))

    used = {t: params for t, params in model.attention.items() if t in model.layers}
    mamba_states = {
        t: MambaSpec(block_size=1, shapes=params.shapes, dtypes=params.dtypes).page_size_bytes
        for t, params in model.attention.items()
        if isinstance(params, MambaLayer)
    }
    attention_block = bs
    padded_mamba_page = None
    attention_used = [params for params in used.values() if not isinstance(params, MambaLayer)]
    if attention_used and len(attention_used) < len(used):  # Mamba and attention layers together
        per_token = max(attention_spec(params, 1).page_size_bytes for params in attention_used)
        state = max(mamba_states[t] for t in mamba_states if t in used)
        needed = KERNEL_BLOCK_ALIGNMENT * cdiv(state, KERNEL_BLOCK_ALIGNMENT * per_token)
        attention_block = max(bs, needed)
        padded_mamba_page = attention_block * per_token

    specs: dict[str, KVCacheSpec] = {}
    by_type: dict[str, KVCacheSpec] = {}
    for type_name, params in model.attention.items():
        if isinstance(params, MambaLayer):
            page = padded_mamba_page if padded_mamba_page and padded_mamba_page > mamba_states[type_name] else None
            by_type[type_name] = MambaSpec(
                block_size=model.max_model_len,
                shapes=params.shapes,
                dtypes=params.dtypes,
                page_size_padded=page,
            )
        else:
            by_type[type_name] = attention_spec(params, attention_block)
    for i, type_name in enumerate(model.layers):
        specs[f"layers.{i}"] = by_type[type_name]
    return specs


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def _blocks_per_request(settings: KVCacheSettings, spec: KVCacheSpec) -> int:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return max(cdiv(s.max_memory_usage_bytes(settings), s.page_size_bytes) for s in spec.kv_cache_specs.values())
    return cdiv(spec.max_memory_usage_bytes(settings), spec.page_size_bytes)


def make_plan(
    model: ModelDescription,
    available_memory: int,
    *,
    max_model_len: int | None = None,
    block_size: int | None = None,
    cache_dtype: str = "auto",
    max_num_batched_tokens: int | None = None,
    disable_hybrid_kv_cache_manager: bool = False,
    num_gpu_blocks_override: int | None = None,
    kv_cache_layout: str | None = None,
) -> dict[str, Any]:
    """Plan a model's KV cache in ``available_memory`` bytes; a JSON-ready dict.

    ``kv_cache_layout`` names the physical layout (``"LBNHC"`` when None);
    it changes the strides and, for block-outermost layouts with mixed page
    sizes, the grouping.

    Raises:
        ValueError: bad sizes, or not enough memory for one request of
            ``max_model_len`` tokens (the message gives the longest that fits).
    """
    cache_config = CacheConfig(
        block_size=model.block_size if block_size is None else block_size,
        cache_dtype=cache_dtype,
        num_gpu_blocks_override=num_gpu_blocks_override,
        kv_cache_layout=kv_cache_layout,
    )
    settings = KVCacheSettings(
        cache_config=cache_config,
        max_model_len=model.max_model_len if max_model_len is None else max_model_len,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    model_for_len = model if max_model_len is None else _with_len(model, max_model_len)
    specs = build_kv_cache_spec(model_for_len, cache_dtype, cache_config.block_size)
    kinds: dict[str, int] = {}
    for spec in specs.values():
        kind = get_kv_cache_spec_kind(spec).value
        kinds[kind] = kinds.get(kind, 0) + 1
    config: KVCacheConfig = get_kv_cache_config(settings, dict(specs), available_memory)
    groups = [_group_summary(settings, gid, group) for gid, group in enumerate(config.kv_cache_groups)]
    concurrency = get_max_concurrency_for_kv_cache_config(settings, config) if config.kv_cache_groups else None
    # every tensor places layers in the one allocation the groups alias
    allocated = max((t.size for t in config.kv_cache_tensors), default=0)
    attention_token_bytes = sum(
        s.page_size_bytes // s.block_size for s in specs.values() if not isinstance(s, MambaSpec)
    )
    return {
        "model": model.name,
        "description": model.description,
        "available_memory_bytes": available_memory,
        "allocated_bytes": allocated,
        "max_model_len": settings.max_model_len,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "cache_dtype": cache_dtype,
        "kv_dtype": _attention_dtype(model, cache_dtype)[0],
        "num_layers": len(specs),
        "layers_by_kind": kinds,
        "disable_hybrid_kv_cache_manager": disable_hybrid_kv_cache_manager,
        "num_blocks": config.num_blocks,
        "usable_blocks": max(config.num_blocks - 1, 0),
        "num_tokens": get_num_tokens_for_kv_cache_config(config),
        "max_concurrency": concurrency,
        "kv_bytes_per_token": attention_token_bytes,
        "groups": groups,
        "kv_cache_layout": config.kv_cache_layout,
        "kv_cache_tensors": [_tensor_summary(t) for t in config.kv_cache_tensors],
    }


def _group_summary(settings: KVCacheSettings, gid: int, group: Any) -> dict[str, Any]:
    """One KV-cache group of the plan: its kind, layers, block and page sizes, and blocks per request."""
    spec = group.kv_cache_spec
    one = next(iter(spec.kv_cache_specs.values())) if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    return {
        "group_id": gid,
        "kind": get_kv_cache_spec_kind(spec).value,
        "num_layers": len(group.layer_names),
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "sliding_window": getattr(one, "sliding_window", None),
        "attention_chunk_size": getattr(one, "attention_chunk_size", None),
        "blocks_per_request": _blocks_per_request(settings, spec),
        "layer_names": list(group.layer_names),
    }


def _tensor_summary(t: Any) -> dict[str, Any]:
    """One planned ``KVCacheTensor``: where its layers sit in the allocation."""
    return {
        "size": t.size,
        "layers": list(t.layers),
        "layer_stride": t.layer_stride,
        "block_stride": t.block_stride,
        "offset": t.offset,
    }


def _with_len(model: ModelDescription, max_model_len: int) -> ModelDescription:
    return ModelDescription(
        name=model.name,
        description=model.description,
        max_model_len=max_model_len,  # make_plan's KVCacheSettings has checked it
        dtype=model.dtype,
        block_size=model.block_size,
        attention=model.attention,
        layers=model.layers,
    )


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as a human-readable table."""
    lines = [f"kvcy plan: {plan['model']}"]
    if plan["description"]:
        lines.append(f"  {plan['description']}")
    lines.append("")

    def row(label: str, value: str) -> None:
        lines.append(f"{label:<22}{value}")

    row("KV-cache memory", f"{_human_bytes(plan['available_memory_bytes'])} ({plan['available_memory_bytes']:,} bytes)")
    budget = plan.get("memory_budget")
    if budget:
        model = _human_bytes(budget["model_memory_bytes"])
        if budget["model_memory_assumed"]:
            model += " (assumed: give --model-memory)"
        row("", f"= GPU {_human_bytes(budget['gpu_memory_bytes'])} x {budget['gpu_memory_utilization']:g} "
            f"- model {model}")
    row("max model length", f"{plan['max_model_len']:,} tokens ({plan['max_num_batched_tokens']:,} batched per step)")
    row("KV-cache dtype", plan["kv_dtype"] + ("" if plan["cache_dtype"] == "auto" else f" ({plan['cache_dtype']})"))
    kinds = ", ".join(f"{n} {k}" for k, n in plan["layers_by_kind"].items())
    row("layers", f"{plan['num_layers']} ({kinds})")
    if plan["kv_bytes_per_token"]:
        row("attention KV / token", f"{_human_bytes(plan['kv_bytes_per_token'])} over all attention layers")
    if plan["disable_hybrid_kv_cache_manager"]:
        row("hybrid manager", "disabled: every layer keeps blocks for all tokens")
    lines.append("")
    if plan["groups"]:
        header = f"{'group':<7}{'kind':<25}{'layers':>7}{'block':>8}{'page/layer':>14}{'blocks/request':>16}  window"
        lines.append(header)
        for g in plan["groups"]:
            window = ""
            if g["sliding_window"]:
                window = f"sliding {g['sliding_window']:,}"
            elif g["attention_chunk_size"]:
                window = f"chunk {g['attention_chunk_size']:,}"
            lines.append(
                f"{g['group_id']:<7}{g['kind']:<25}{g['num_layers']:>7}{g['block_size']:>8}"
                f"{_human_bytes(g['page_size_bytes']):>14}{g['blocks_per_request']:>16,}  {window}".rstrip()
            )
        lines.append("")
    tensors = plan["kv_cache_tensors"]
    if tensors:
        per_block = plan["allocated_bytes"] // plan["num_blocks"] if plan["num_blocks"] else 0
        placements = "1 placement" if len(tensors) == 1 else f"{len(tensors)} placements aliasing it"
        row(
            "memory",
            f"one {plan['kv_cache_layout']} allocation of {_human_bytes(plan['allocated_bytes'])} "
            f"({_human_bytes(per_block)} per block), {placements}",
        )
    row("blocks", f"{plan['num_blocks']:,} ({plan['usable_blocks']:,} usable; block 0 is the null block)")
    if plan["groups"]:
        ngroups = len(plan["groups"])
        how = ""
        if ngroups > 1:
            how = f" ({plan['num_blocks']:,} blocks // {ngroups} groups x block size, as vLLM logs it)"
        row("KV cache size", f"{plan['num_tokens']:,} tokens{how}")
    if plan["max_concurrency"] is not None:
        row("max concurrency", f"{plan['max_concurrency']:.2f}x requests of {plan['max_model_len']:,} tokens")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

#: Flags that describe a model; with --preset or --model they would be ignored.
_LAYER_FLAGS = {
    "full_layers": "--full-layers",
    "sliding_window_layers": "--sliding-window-layers",
    "sliding_window": "--sliding-window",
    "chunked_layers": "--chunked-layers",
    "chunk_size": "--chunk-size",
    "mla_layers": "--mla-layers",
    "num_kv_heads": "--num-kv-heads",
    "head_size": "--head-size",
    "name": "--name",
}

_EPILOG = """\
The KV-cache budget is --kv-memory SIZE, or --gpu-memory SIZE x --gpu-memory-utilization
- --model-memory SIZE (weights and activations; 0 when not given, and the plan says so).
SIZE: 20GiB, 20G or 20Gi (binary), 40GB (decimal), 5e9 or 1073741824 (bytes).

exit status: 0 planned, 1 one max-length request does not fit (the message gives the longest
that does), 2 bad arguments (the budget holds not even one block, for instance).

examples:
  kvcy plan --preset llama-3-8b --kv-memory 20GiB
  kvcy plan --preset gemma-3-27b --gpu-memory 80GiB --model-memory 54GiB --json
  kvcy plan --full-layers 8 --sliding-window-layers 40 --sliding-window 4096 \
      --num-kv-heads 8 --head-size 128 --max-model-len 32768 --kv-memory 16GiB"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` to the ``kvcy`` sub-parsers; return its parser."""
    p = subparsers.add_parser(
        "plan",
        help="how many KV-cache blocks, tokens and requests fit in memory",
        usage="kvcy plan (--preset NAME | --model FILE | layer flags) (--kv-memory SIZE | --gpu-memory SIZE) "
        "[options]",
        description="How many KV-cache blocks, tokens and concurrent max-length requests fit in a memory budget "
        "(vLLM 0.33.0's planning).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    p.set_defaults(func=run, _parser=p)
    src = p.add_argument_group("model (a preset, a file, or layer flags)")
    src.add_argument("--preset", help="a bundled model description (see --list-presets)")
    src.add_argument("--model", type=Path, help="a JSON model description (same format as the presets)")
    src.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    count = int_arg(0)
    src.add_argument("--full-layers", type=count, metavar="N", help="number of full-attention layers")
    src.add_argument("--sliding-window-layers", type=count, metavar="N", help="number of sliding-window layers")
    src.add_argument("--sliding-window", type=positive_int, metavar="TOKENS", help="sliding window, in tokens")
    src.add_argument("--chunked-layers", type=count, metavar="N", help="number of chunked-local layers")
    src.add_argument("--chunk-size", type=positive_int, metavar="TOKENS", help="local attention chunk, in tokens")
    src.add_argument("--mla-layers", type=count, metavar="N", help="number of MLA layers (--head-size = latent)")
    src.add_argument("--num-kv-heads", type=positive_int, metavar="N", help="KV heads per attention layer")
    src.add_argument("--head-size", type=positive_int, metavar="N", help="head size (MLA: latent size)")
    src.add_argument("--name", help="name of a model given by layer flags (default custom)")
    src.add_argument("--dtype", default=None, help="model dtype (default: the model's, else bfloat16)")

    mem = p.add_argument_group("memory budget")
    mem.add_argument("--kv-memory", "--memory", dest="kv_memory", type=size_arg, metavar="SIZE",
                     help="memory of the KV cache itself, as in 'kvcy replay --kv-memory'")
    mem.add_argument("--gpu-memory", type=size_arg, metavar="SIZE",
                     help="total GPU memory: the KV cache gets SIZE x --gpu-memory-utilization - --model-memory")
    mem.add_argument("--gpu-memory-utilization", type=float_arg(0.0, 1.0, include_minimum=False), metavar="F",
                     default=CacheConfig.gpu_memory_utilization,
                     help="fraction of --gpu-memory this instance may use (default %(default)s)")
    mem.add_argument("--model-memory", type=size_arg, metavar="SIZE",
                     help="weights and activations, with --gpu-memory (default 0, which the plan points out)")

    run_ = p.add_argument_group("serving")
    run_.add_argument("--max-model-len", type=positive_int, metavar="N", help="longest request in tokens "
                      "(default: the model's)")
    run_.add_argument("--block-size", type=positive_int, metavar="N", help="tokens per block "
                      "(default: the model's, else 16)")
    run_.add_argument("--kv-cache-dtype", default="auto", choices=CACHE_DTYPES, help="KV-cache dtype (default auto)")
    run_.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N",
                      help="tokens scheduled per step (default 2048)")
    run_.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                      help="manage sliding-window and chunked layers as full attention")
    run_.add_argument("--num-gpu-blocks-override", type=int_arg(2, why=" (block 0 is the null block)"), metavar="N",
                      help="use this many blocks, the null block included")
    run_.add_argument("--kv-cache-layout", choices=[m.name for m in KVCacheLayout], metavar="LAYOUT",
                      help="physical layout of [layer, block, head, token, content] "
                      f"({', '.join(m.name for m in KVCacheLayout)}; default LBNHC)")
    run_.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def _model_from_flags(args: argparse.Namespace, p: argparse.ArgumentParser) -> ModelDescription:
    counts = {
        "full": args.full_layers,
        "sliding_window": args.sliding_window_layers,
        "chunked_local": args.chunked_layers,
        "mla": args.mla_layers,
    }
    counts = {k: v for k, v in counts.items() if v}
    if not counts:
        p.error("give --preset, --model, or layer counts (--full-layers, --sliding-window-layers, "
                "--chunked-layers, --mla-layers)")
    if "sliding_window" in counts and args.sliding_window is None:
        p.error("--sliding-window-layers needs --sliding-window")
    if "chunked_local" in counts and args.chunk_size is None:
        p.error("--chunked-layers needs --chunk-size")
    if args.head_size is None:
        p.error("give --head-size")
    if set(counts) - {"mla"} and args.num_kv_heads is None:
        p.error("give --num-kv-heads")
    attention: dict[str, dict[str, Any]] = {}
    for kind in counts:
        params: dict[str, Any] = {"kind": kind, "head_size": args.head_size}
        if kind != "mla":
            params["num_kv_heads"] = args.num_kv_heads
        if kind == "sliding_window":
            params["sliding_window"] = args.sliding_window
        if kind == "chunked_local":
            params["attention_chunk_size"] = args.chunk_size
        attention[kind] = params
    if args.max_model_len is None:
        p.error("give --max-model-len for a model given by layer flags")
    described = ", ".join(f"{n} {k}" for k, n in counts.items())
    return ModelDescription.from_dict(
        args.name or "custom",
        {
            "description": f"{described} layers",
            "max_model_len": args.max_model_len,
            "dtype": args.dtype or "bfloat16",
            "block_size": args.block_size or 16,
            "attention": attention,
            "layers": interleave_layers(counts),
        },
    )


def _load_model(args: argparse.Namespace, p: argparse.ArgumentParser) -> ModelDescription:
    if args.preset and args.model:
        p.error("give either --preset or --model, not both")
    if args.preset or args.model:
        given = [flag for dest, flag in _LAYER_FLAGS.items() if getattr(args, dest) is not None]
        if given:
            source = f"--preset {args.preset}" if args.preset else f"--model {args.model}"
            p.error(f"layer flags ({', '.join(given)}) describe a model, and {source} describes one already: "
                    "give one or the other (--max-model-len, --block-size and --dtype do apply to a preset or file)")
    try:
        if args.preset:
            presets = load_presets()
            if args.preset not in presets:
                p.error(f"unknown preset {args.preset!r}; choose from {', '.join(presets)}")
            model = ModelDescription.from_dict(args.preset, presets[args.preset])
        elif args.model:
            try:
                model = ModelDescription.from_json(args.model)
            except OSError as exc:
                p.error(f"cannot read model description {str(args.model)!r}: {exc}")
        else:
            model = _model_from_flags(args, p)
        if args.dtype and (args.preset or args.model):
            model.dtype = canonical_dtype(args.dtype)
    except ValueError as exc:
        p.error(str(exc))
    return model


def _memory_budget(args: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[int, dict[str, Any] | None]:
    """The KV-cache bytes, and how they were worked out from GPU memory (``None`` with --kv-memory)."""
    if args.kv_memory is not None and args.gpu_memory is not None:
        p.error("give either --kv-memory or --gpu-memory, not both")
    if args.kv_memory is not None:
        if args.model_memory is not None:
            p.error("--model-memory goes with --gpu-memory; --kv-memory is the KV cache's memory already")
        return args.kv_memory, None
    if args.gpu_memory is None:
        p.error("give the KV-cache budget: --kv-memory SIZE, or --gpu-memory SIZE [--model-memory SIZE]")
    usable = int(args.gpu_memory * args.gpu_memory_utilization)
    model_memory = 0 if args.model_memory is None else args.model_memory
    if model_memory >= usable:
        p.error(
            f"--model-memory {_human_bytes(model_memory)} leaves nothing for the KV cache: "
            f"--gpu-memory {_human_bytes(args.gpu_memory)} x {args.gpu_memory_utilization:g} is "
            f"{_human_bytes(usable)}"
        )
    return usable - model_memory, {
        "gpu_memory_bytes": args.gpu_memory,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "model_memory_bytes": model_memory,
        "model_memory_assumed": args.model_memory is None,
    }


def main(argv: list[str]) -> int:
    """Run ``kvcy plan`` with ``argv`` (the arguments after ``plan``); return the exit status."""
    from kvcy.cli import main as kvcy_main

    return kvcy_main(["plan", *argv])


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``kvcy plan``: 0 planned, 1 a max-length request does not fit, 2 bad arguments."""
    p: argparse.ArgumentParser = args._parser
    if args.list_presets:
        for name, data in load_presets().items():
            print(f"{name:<18}{data.get('description', '')}")
        return 0
    model = _load_model(args, p)
    available, budget = _memory_budget(args, p)
    if budget is not None and budget["model_memory_assumed"]:
        print(
            f"kvcy plan: note: no --model-memory given, so the KV cache is planned in all of "
            f"{_human_bytes(available)} (GPU memory x utilization), as if the weights took no memory",
            file=sys.stderr,
        )
    try:
        plan = make_plan(
            model,
            available,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            cache_dtype=args.kv_cache_dtype,
            max_num_batched_tokens=args.max_num_batched_tokens,
            disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            kv_cache_layout=args.kv_cache_layout,
        )
    except NotEnoughKVCacheMemory as exc:
        if exc.estimated_max_model_len == 0:  # not one block per layer: the budget is wrong, not the length
            if exc.available_memory <= 0:  # the null block (one block of every layer) took it all
                p.error(f"a KV-cache budget of {_human_bytes(available)} is too small for {model.name}: "
                        f"the null block alone (one block of every layer) takes "
                        f"{_human_bytes(available - exc.available_memory)}")
            p.error(f"a KV-cache budget of {_human_bytes(available)} is too small for {model.name}: {exc}")
        if args.json:
            print(json.dumps({"model": model.name, "error": str(exc)}, indent=2))
        print(f"kvcy plan: {model.name} does not fit: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        p.error(str(exc))
    if budget is not None:
        plan["memory_budget"] = budget
    print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
