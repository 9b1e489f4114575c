"""A seeded synthetic trace: shared system prompts and multi-turn conversations.

Each conversation starts at a Poisson arrival, picks one of a few shared system
prompts, and runs for 1 to ``max_turns`` turns.  Turn *k*'s prompt is the
system prompt followed by every earlier user message and answer, then the new
user message; the answers are part of the trace (``TraceRequest.output``), so
the scheduler loop generates exactly those tokens and a follow-up turn can hit
the blocks its previous turn cached.  Follow-up turns arrive an exponential
"think time" after the previous turn's arrival.

Everything is a deterministic function of the seed and the parameters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

from kvcy.sim.traces import Trace, TraceRequest, fresh_tokens

__all__ = ["SyntheticConfig", "parse_synthetic_spec", "synthetic_trace"]


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of :func:`synthetic_trace` (see the module docstring).

    Lengths are in tokens, times in milliseconds, ``rate`` in conversations per
    second.  ``(lo, hi)`` ranges are inclusive and sampled uniformly.
    """

    conversations: int = 100
    max_turns: int = 4
    system_prompts: int = 4
    system_len: int = 1024
    user_min: int = 32
    user_max: int = 512
    output_min: int = 16
    output_max: int = 256
    rate: float = 2.0
    think_ms: float = 5000.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value < 0:
                raise ValueError(f"synthetic {f.name} must be >= 0, got {value!r}")
        if self.max_turns < 1 or self.system_prompts < 1:
            raise ValueError("synthetic max_turns and system_prompts must be >= 1")
        if self.user_min < 1 or self.user_min > self.user_max:
            raise ValueError(f"synthetic user length range [{self.user_min}, {self.user_max}] is empty or starts at 0")
        if self.output_min < 1 or self.output_min > self.output_max:
            raise ValueError(
                f"synthetic output length range [{self.output_min}, {self.output_max}] is empty or starts at 0"
            )
        if self.rate <= 0:
            raise ValueError(f"synthetic rate must be > 0, got {self.rate}")


def parse_synthetic_spec(spec: str) -> SyntheticConfig:
    """Parse ``"synthetic"`` or ``"synthetic:key=value,key=value"``.

    Keys are the :class:`SyntheticConfig` field names.

    Raises:
        ValueError: unknown key or a value that is not a number.
    """
    head, _, rest = spec.partition(":")
    if head != "synthetic":
        raise ValueError(f"not a synthetic trace spec: {spec!r}")
    kwargs: dict[str, float | int] = {}
    known = {f.name: f.type for f in fields(SyntheticConfig)}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in known:
            raise ValueError(
                f"bad synthetic option {item!r}; use key=value with keys: {', '.join(known)}"
            )
        try:
            kwargs[key] = float(value) if known[key] in ("float", float) else int(value)
        except ValueError:
            raise ValueError(f"synthetic option {key} needs a number, got {value!r}") from None
    return SyntheticConfig(**kwargs)  # type: ignore[arg-type]


def synthetic_trace(seed: int = 0, config: SyntheticConfig | None = None, limit: int | None = None) -> Trace:
    """Generate a shared-prefix, multi-turn trace.

    Args:
        seed: the random seed; equal seeds and configs give equal traces.
        config: the generator parameters (defaults: :class:`SyntheticConfig`).
        limit: keep only the first ``limit`` requests by arrival.
    """
    cfg = config or SyntheticConfig()
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return fresh_tokens(b"kvcy-synthetic:%d:%d" % (seed, rng.getrandbits(64)), n)

    systems = [tokens(cfg.system_len) for _ in range(cfg.system_prompts)]
    requests: list[TraceRequest] = []
    t_ms = 0.0
    for c in range(cfg.conversations):
        t_ms += rng.expovariate(cfg.rate) * 1000.0
        history = list(systems[rng.randrange(cfg.system_prompts)])
        arrival = t_ms
        for turn in range(rng.randint(1, cfg.max_turns)):
            if turn:
                arrival += rng.expovariate(1.0 / cfg.think_ms) if cfg.think_ms > 0 else 0.0
            history += tokens(rng.randint(cfg.user_min, cfg.user_max))
            output = tokens(rng.randint(cfg.output_min, cfg.output_max))
            requests.append(
                TraceRequest(
                    request_id=f"c{c}t{turn}",
                    arrival_ms=round(arrival, 3),
                    num_prompt_tokens=len(history),
                    num_output_tokens=len(output),
                    prompt=list(history),
                    output=output,
                )
            )
            history += output
    requests.sort(key=lambda r: r.arrival_ms)
    total = len(requests)
    if limit is not None:
        requests = requests[:limit]
    for i, r in enumerate(requests):
        r.index = i
    return Trace(
        name=f"synthetic(seed={seed})",
        requests=requests,
        source=f"synthetic seed={seed} {cfg}",
        total_in_source=total,
        info={"seed": seed, **{f.name: getattr(cfg, f.name) for f in fields(cfg)}},
    )
