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

from kvcy.sim.traces import MAX_ARRIVAL_MS, Trace, TraceRequest, fresh_tokens

__all__ = ["MAX_TOTAL_PROMPT_TOKENS", "SyntheticConfig", "parse_synthetic_spec", "synthetic_trace"]


#: Upper bounds of the parameters: beyond them a trace would not fit in memory
#: or its times would leave the range a trace may use.
_LIMITS = {
    "conversations": 1_000_000,
    "max_turns": 1000,
    "system_prompts": 10_000,
    "system_len": 1 << 20,
    "user_min": 1 << 20,
    "user_max": 1 << 20,
    "output_min": 1 << 20,
    "output_max": 1 << 20,
    "rate": 1e9,
    "think_ms": 3.6e9,  # 1,000 hours
}
#: Most prompt tokens a synthetic trace may hold in all (64 Mi, about 2.4 times
#: the bundled trace; each prompt is kept as a list: this is about 0.5 GiB).
MAX_TOTAL_PROMPT_TOKENS = 1 << 26


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
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"synthetic {f.name} must be a number, got {value!r}")
            if not 0 <= value <= _LIMITS[f.name]:  # NaN fails too
                raise ValueError(f"synthetic {f.name} must be a number from 0 to {_LIMITS[f.name]:g}, got {value!r}")
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
        ValueError: unknown key, a value that is not a number (a whole one for the counts and
            lengths: ``1e6`` is one), or out of its range (see :class:`SyntheticConfig`).
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
            number = float(value)
        except ValueError:
            raise ValueError(f"synthetic option {key} needs a number, got {value!r}") from None
        if known[key] in ("float", float):
            kwargs[key] = number
            continue
        try:
            kwargs[key] = int(value)
        except ValueError:  # 1e6 or 200.0: a whole number written as a float
            if not number.is_integer():
                raise ValueError(f"synthetic option {key} needs a whole number, got {value!r}") from None
            kwargs[key] = int(number)
    return SyntheticConfig(**kwargs)  # type: ignore[arg-type]


def synthetic_trace(seed: int = 0, config: SyntheticConfig | None = None, limit: int | None = None) -> Trace:
    """Generate a shared-prefix, multi-turn trace.

    Args:
        seed: the random seed; equal seeds and configs give equal traces.
        config: the generator parameters (defaults: :class:`SyntheticConfig`).
        limit: keep only the first ``limit`` requests by arrival.

    Raises:
        ValueError: the trace would hold more than
            :data:`MAX_TOTAL_PROMPT_TOKENS` prompt tokens, or a request would
            arrive after :data:`~kvcy.sim.traces.MAX_ARRIVAL_MS`.
    """
    cfg = config or SyntheticConfig()
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return fresh_tokens(b"kvcy-synthetic:%d:%d" % (seed, rng.getrandbits(64)), n)

    systems = [tokens(cfg.system_len) for _ in range(cfg.system_prompts)]
    requests: list[TraceRequest] = []
    t_ms = 0.0
    total_prompt = 0
    for c in range(cfg.conversations):
        t_ms += rng.expovariate(cfg.rate) * 1000.0
        history = list(systems[rng.randrange(cfg.system_prompts)])
        arrival = t_ms
        for turn in range(rng.randint(1, cfg.max_turns)):
            if turn:
                arrival += rng.expovariate(1.0 / cfg.think_ms) if cfg.think_ms > 0 else 0.0
            history += tokens(rng.randint(cfg.user_min, cfg.user_max))
            total_prompt += len(history)
            if total_prompt > MAX_TOTAL_PROMPT_TOKENS:
                raise ValueError(
                    f"the synthetic trace would hold more than {MAX_TOTAL_PROMPT_TOKENS:,} prompt tokens; "
                    "ask for fewer conversations, turns or tokens"
                )
            if not arrival <= MAX_ARRIVAL_MS:
                raise ValueError(
                    f"synthetic conversation {c} would arrive after {MAX_ARRIVAL_MS:g} ms; "
                    "raise rate or lower think_ms"
                )
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
