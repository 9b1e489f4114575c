"""Trace readers: the Mooncake JSONL reader, its token ids, the bundled file, the synthetic generator."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest

from kvcy.sim.synthetic import SyntheticConfig, parse_synthetic_spec, synthetic_trace
from kvcy.sim.traces import (
    MOONCAKE_BLOCK,
    bundled_trace_path,
    fresh_tokens,
    mooncake_block_tokens,
    mooncake_prompt,
    read_mooncake,
)


def _write(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- token ids
def test_fresh_tokens_are_deterministic_16_bit():
    a = fresh_tokens(b"x", 1000)
    assert a == fresh_tokens(b"x", 1000)
    assert a != fresh_tokens(b"y", 1000)
    assert len(a) == 1000 and all(0 <= t < 65536 for t in a)
    assert fresh_tokens(b"x", 10) == a[:10]
    assert fresh_tokens(b"x", 0) == []


def test_block_tokens_depend_on_the_id_only():
    full = mooncake_block_tokens(7)
    assert len(full) == MOONCAKE_BLOCK
    assert full[0] == 7  # the id itself: different ids differ from the first token on
    assert mooncake_block_tokens(7, 100) == full[:100]
    assert mooncake_block_tokens(8)[0] == 8
    assert mooncake_block_tokens(7, 0) == []


def test_prompt_is_the_blocks_concatenated():
    prompt = mooncake_prompt((3, 9, 4), 1100)
    assert len(prompt) == 1100
    assert prompt[:512] == mooncake_block_tokens(3)
    assert prompt[512:1024] == mooncake_block_tokens(9)
    assert prompt[1024:] == mooncake_block_tokens(4, 76)


# --------------------------------------------------------------------------- reader
def test_read_mooncake(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 3000, "input_length": 512, "output_length": 0, "hash_ids": [0]},
        {"timestamp": 3000, "input_length": 10, "output_length": 2, "hash_ids": [5]},
    ]
    t = read_mooncake(_write(tmp_path, rows))
    assert [r.request_id for r in t] == ["r0", "r1", "r2"]
    assert [r.arrival_ms for r in t] == [0.0, 3000.0, 3000.0]
    assert t.requests[0].hash_ids == (0, 1)
    assert t.requests[1].num_output_tokens == 1  # 0 is read as 1: a request samples at least one token
    assert t.total_in_source == 3 and t.name == "t"
    assert len(t.requests[0].prompt_token_ids()) == 600
    out = t.requests[0].output_token_ids()
    assert len(out) == 5 and out == t.requests[0].output_token_ids()
    assert out != t.requests[2].output_token_ids()[:2] + [0, 0, 0]
    assert len(read_mooncake(_write(tmp_path, rows), limit=2)) == 2


@pytest.mark.parametrize("limit", [2.5, True, "2"])
def test_read_mooncake_refuses_a_limit_that_is_not_an_int(tmp_path, limit):
    # 2.5 used to read 3 requests and True 1: a wrong type became a wrong count
    path = _write(tmp_path, [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}] * 3)
    with pytest.raises(TypeError, match="limit must be an int or None"):
        read_mooncake(path, limit=limit)


def test_read_mooncake_gzip(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [2]}) + "\n\n")
    t = read_mooncake(path)
    assert len(t) == 1 and t.name == "t"


def test_arrivals_sorted_stably(tmp_path):
    rows = [
        {"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [2]},
    ]
    t = read_mooncake(_write(tmp_path, rows))
    assert [r.request_id for r in t] == ["r1", "r0", "r2"]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}, "expected 2"),
        ({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}, "timestamp"),
        ({"timestamp": 0, "input_length": "9", "output_length": 1, "hash_ids": [0]}, "input_length"),
        ({"timestamp": 0, "input_length": 1, "output_length": -2, "hash_ids": [0]}, "output_length"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}, "hash_ids"),
        ([1, 2], "Expected `object`, got `array`"),
        # Python's json writes NaN and Infinity, which are not JSON: a NaN arrival never compares as
        # arrived (the replay spun forever); msgspec refuses them as it decodes
        ({"timestamp": float("nan"), "input_length": 1, "output_length": 1, "hash_ids": [0]},
         r"JSON is malformed: invalid character \(byte 14\)"),
        ({"timestamp": float("inf"), "input_length": 1, "output_length": 1, "hash_ids": [0]}, "JSON is malformed"),
        ({"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [0]},
         r"Expected `float` <= 10000000000000.0 - at `\$\.timestamp`"),
        ({"timestamp": True, "input_length": 1, "output_length": 1, "hash_ids": [0]},
         r"Expected `float`, got `bool` - at `\$\.timestamp`"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1.5, "hash_ids": [0]},
         r"Expected `int`, got `float` - at `\$\.output_length`"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1}, "Object missing required field `hash_ids`"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []},
         r"Expected `int` >= 1 - at `\$\.input_length`"),
        ({"timestamp": 0, "input_length": 2**40, "output_length": 1, "hash_ids": [0]}, "input_length"),
        ({"timestamp": 0, "input_length": 1, "output_length": 10**12, "hash_ids": [0]}, "output_length"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [2**63]},
         r"Expected `int` <= 9223372036854775807 - at `\$\.hash_ids\[0\]`"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [2**64]}, "hash_ids"),
    ],
)
def test_read_mooncake_rejects_bad_lines(tmp_path, row, message):
    path = _write(tmp_path, [{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}, row])
    with pytest.raises(ValueError, match=message) as e:
        read_mooncake(path)
    assert str(e.value).startswith("t.jsonl line 2: ")


def test_read_mooncake_not_json_and_missing(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{nope\n")
    with pytest.raises(ValueError, match=r"bad.jsonl line 1: JSON is malformed: object keys must be strings"):
        read_mooncake(path)
    with pytest.raises(FileNotFoundError):
        read_mooncake(tmp_path / "absent.jsonl")


def test_read_mooncake_checks_only_the_lines_it_reads(tmp_path):
    good = json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}).encode()
    path = tmp_path / "t.jsonl"
    path.write_bytes(good + b"\n\n   \n" + b"\xff\xfe not text\n")
    t = read_mooncake(path, limit=1)  # the bad line is counted, not read
    assert len(t) == 1 and t.total_in_source == 2
    with pytest.raises(ValueError, match=r"t.jsonl line 4: JSON is malformed"):
        read_mooncake(path)


# --------------------------------------------------------------------------- bundled file
@pytest.fixture(scope="module")
def bundled():
    return read_mooncake(bundled_trace_path())


def test_bundled_trace_is_the_conversation_head(bundled):
    assert len(bundled) == 2000
    assert bundled.requests[0].num_prompt_tokens == 6758
    assert sum(r.num_prompt_tokens for r in bundled) == 27_441_774
    folder = bundled_trace_path().parent
    assert (folder / "LICENSE-APACHE").is_file() and (folder / "PROVENANCE.md").is_file()
    assert bundled_trace_path().stat().st_size < 1_000_000


def test_bundled_equal_ids_mean_equal_prefixes(bundled):
    """Equal hash ids at position j imply equal ids before j, hence equal token prefixes.

    Tokens are a function of (id, offset in block) only, so equal id sequences give
    equal tokens; checked on a sample of real token lists too.
    """
    parent: dict[int, tuple[int, int]] = {}
    for r in bundled:
        for j, h in enumerate(r.hash_ids):
            key = (j, r.hash_ids[j - 1] if j else -1)
            assert parent.setdefault(h, key) == key, f"id {h} seen at two places in the chain"
    by_first_two = defaultdict(list)
    for r in bundled.requests[:300]:
        if len(r.hash_ids) >= 2:
            by_first_two[r.hash_ids[:2]].append(r)
    pairs = [rs[:2] for rs in by_first_two.values() if len(rs) >= 2]
    assert pairs, "the head has requests sharing two blocks"
    for a, b in pairs[:5]:
        n = min(2 * MOONCAKE_BLOCK, a.num_prompt_tokens, b.num_prompt_tokens)
        assert a.prompt_token_ids()[:n] == b.prompt_token_ids()[:n]


def test_bundled_equal_prefixes_mean_equal_ids(bundled):
    """The converse: two different ids never start the same, so no extra sharing at any block size."""
    ids = sorted({h for r in bundled for h in r.hash_ids})
    first = {}
    for h in ids[:: max(1, len(ids) // 3000)]:
        tokens = tuple(mooncake_block_tokens(h, 2))
        assert tokens[0] == h
        assert first.setdefault(tokens, h) == h
    a, b = bundled.requests[0], bundled.requests[1]  # share block 0 only
    assert a.hash_ids[0] == b.hash_ids[0] and a.hash_ids[1] != b.hash_ids[1]
    pa, pb = a.prompt_token_ids(), b.prompt_token_ids()
    common = next(i for i, (x, y) in enumerate(zip(pa, pb)) if x != y)
    assert common == MOONCAKE_BLOCK


# --------------------------------------------------------------------------- synthetic
def test_synthetic_is_seeded():
    a = synthetic_trace(3, SyntheticConfig(conversations=10))
    b = synthetic_trace(3, SyntheticConfig(conversations=10))
    c = synthetic_trace(4, SyntheticConfig(conversations=10))
    assert [(r.request_id, r.arrival_ms, r.prompt) for r in a] == [(r.request_id, r.arrival_ms, r.prompt) for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert [r.arrival_ms for r in a] == sorted(r.arrival_ms for r in a)
    assert [r.index for r in a] == list(range(len(a)))


def test_synthetic_shares_system_prompts_and_turns():
    cfg = SyntheticConfig(conversations=20, max_turns=3, system_prompts=2, system_len=64)
    t = synthetic_trace(1, cfg)
    heads = {tuple(r.prompt[:64]) for r in t}
    assert len(heads) <= 2
    by_id = {r.request_id: r for r in t}
    follow_ups = 0
    for r in t:
        conv, turn = r.request_id[1:].split("t")
        if int(turn) > 0:
            prev = by_id[f"c{conv}t{int(turn) - 1}"]
            history = prev.prompt + prev.output
            assert r.prompt[: len(history)] == history
            assert prev.arrival_ms <= r.arrival_ms
            follow_ups += 1
        assert r.num_prompt_tokens == len(r.prompt) and r.num_output_tokens == len(r.output)
        assert cfg.output_min <= r.num_output_tokens <= cfg.output_max
    assert follow_ups > 0
    assert len(synthetic_trace(1, cfg, limit=5)) == 5


def test_synthetic_spec():
    cfg = parse_synthetic_spec("synthetic:conversations=7,rate=0.5,max-turns=2")
    assert (cfg.conversations, cfg.rate, cfg.max_turns) == (7, 0.5, 2)
    assert parse_synthetic_spec("synthetic") == SyntheticConfig()
    with pytest.raises(ValueError, match="bad synthetic option"):
        parse_synthetic_spec("synthetic:bogus=1")
    with pytest.raises(ValueError, match="needs a number"):
        parse_synthetic_spec("synthetic:conversations=x")
    with pytest.raises(ValueError):
        parse_synthetic_spec("synthetic:user_min=10,user_max=5")
    with pytest.raises(ValueError):
        parse_synthetic_spec("synthetic:rate=0")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:rate=nan", "rate must be a number"),
        ("synthetic:rate=inf", "rate must be a number"),
        ("synthetic:think_ms=inf", "think_ms must be a number"),
        ("synthetic:think_ms=-1", "think_ms must be a number"),
        ("synthetic:conversations=1000000000", "conversations must be a number"),
        ("synthetic:user_max=1000000000", "user_max must be a number"),
    ],
)
def test_synthetic_spec_rejects_non_finite_and_absurd_values(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_synthetic_spec(spec)


def test_synthetic_trace_refuses_what_a_replay_could_not_follow(monkeypatch):
    with pytest.raises(ValueError, match="would arrive after"):
        synthetic_trace(0, SyntheticConfig(conversations=2, rate=1e-300))
    import kvcy.sim.synthetic as synthetic

    monkeypatch.setattr(synthetic, "MAX_TOTAL_PROMPT_TOKENS", 20_000)  # the real cap is 64 Mi tokens
    with pytest.raises(ValueError, match="more than 20,000 prompt tokens"):
        synthetic_trace(0, SyntheticConfig(conversations=100, max_turns=8, system_len=1000))
    assert len(synthetic_trace(0, SyntheticConfig(conversations=2, max_turns=1, system_len=1000))) == 2
