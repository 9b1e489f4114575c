"""vLLM 0.33.0's own planner and layout resolution, which stay vLLM's when its tests run on kvcy
(kvcy.testing.vllm_core), given kvcy's specs after the redirect: the same bytes per block and
the same layout as given vLLM's own specs.

The redirect rebinds names across vLLM's modules for the rest of the process, so each check
runs in a child interpreter of its own: vLLM's specs first, then the redirect and kvcy's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import vllm.v1.kv_cache_interface as vllm_specs
    from unittest.mock import MagicMock
    from vllm.config import CacheConfig
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core import kv_cache_planning


    def figures(specs):
        def mla(head_size):
            return specs.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=head_size, dtype=torch.uint8)

        first = {f"mla.{i}": mla(512) for i in range(3)}
        first.update({f"idx.{i}": mla(128) for i in range(3)})
        second = {f"swa.{i}": mla(512) for i in range(5)}
        groups = [
            specs.KVCacheGroupSpec(list(layers), specs.UniformTypeKVCacheSpecs(block_size=64, kv_cache_specs=layers))
            for layers in (first, second)
        ]
        out = {
            layout: kv_cache_planning._get_kv_cache_bytes_per_block(groups, specs.KVCacheLayout[layout])
            for layout in ("BLHNC", "LBNHC")
        }
        # A DCP-sharded MLA target beside a replicated draft of another page size.
        config = MagicMock()
        config.cache_config = CacheConfig(block_size=16)
        config.cache_config.kv_cache_layout = None
        config.kv_transfer_config = None
        config.parallel_config.decode_context_parallel_size = 4
        target = specs.MLAAttentionSpec(
            block_size=16, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.float32
        )
        draft = specs.FullAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, dcp_sharded=False
        )
        out["draft_layout"] = resolve_kv_cache_layout(config, [["LBHNC", "BLHNC"]], [target, draft]).name
        return out


    result = {"vllm": figures(vllm_specs)}
    from kvcy.testing import vllm_core

    vllm_core.redirect()
    import kvcy.kv_cache_interface as kvcy_specs

    assert vllm_specs.UniformTypeKVCacheSpecs is kvcy_specs.UniformTypeKVCacheSpecs
    result["kvcy"] = figures(kvcy_specs)
    print(json.dumps(result))
    """
)


def _run() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("VLLM_KV_CACHE_LAYOUT", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_planner_reads_kvcy_specs_as_it_reads_its_own() -> None:
    result = _run()
    assert result["kvcy"] == result["vllm"]
    # The largest group's dense packing, 64 tokens a block: five 512-byte layers beat
    # three 512-byte and three 128-byte ones.
    assert result["vllm"]["BLHNC"] == 64 * max(3 * 512 + 3 * 128, 5 * 512)
    assert result["vllm"]["draft_layout"] == "BLHNC"
