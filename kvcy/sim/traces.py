"""Request traces: the Mooncake JSON Lines reader and the bundled trace.

A trace is a list of :class:`TraceRequest` in arrival order.  A request's
prompt is either given explicitly (synthetic traces) or described by Mooncake
``hash_ids``: one id per 512-token block, where equal ids mean an identical
prefix up to and including that block.  :func:`mooncake_block_tokens` turns an
id into 512 concrete token ids, derived deterministically from the id alone, so
that equal ids give equal tokens and the manager's own hash chain reproduces the
trace's sharing at any block size (exactly so for block sizes dividing 512; at
other sizes a shared prefix is hit up to the last full block inside it).

A block's first token is its hash id and the rest are pseudo-random in
``[0, 65536)``; the last id of a request covers a partial block of
``input_length % 512`` tokens and gets the first tokens of that id's block.
Output tokens carry no ids in the trace: each request generates fresh ones.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

__all__ = [
    "MAX_ARRIVAL_MS",
    "MAX_LINE_BYTES",
    "MAX_TOKENS_PER_REQUEST",
    "MOONCAKE_BLOCK",
    "BUNDLED_TRACE",
    "Trace",
    "TraceRequest",
    "bundled_trace_path",
    "fresh_tokens",
    "hit_rate_upper_bound",
    "mooncake_block_tokens",
    "mooncake_prompt",
    "read_mooncake",
]

#: Tokens per Mooncake hash id.
MOONCAKE_BLOCK = 512

#: Latest arrival time a trace may give, in ms (about 317 years: Unix-epoch
#: milliseconds fit; at this size a double still resolves 2 µs).
MAX_ARRIVAL_MS = 1e13

#: Longest prompt, and longest output, a trace request may have (16 Mi tokens).
MAX_TOKENS_PER_REQUEST = 1 << 24

#: Longest line a trace may have, in bytes: the longest request (16 Mi tokens, 32 Ki hash ids of
#: up to 19 digits) takes about 650 KB; a longer line is refused before it is held in memory.
MAX_LINE_BYTES = 1 << 20

#: Largest Mooncake hash id (a signed 64-bit token id: it is a block's first token).
_MAX_HASH_ID = (1 << 63) - 1

#: File name of the trace head shipped in ``kvcy/data/traces``.
BUNDLED_TRACE = "conversation_trace_head2000.jsonl"

_BIG_ENDIAN = sys.byteorder == "big"


def fresh_tokens(key: bytes, n: int) -> list[int]:
    """``n`` token ids in ``[0, 65536)``, a deterministic function of ``key``.

    SHAKE-128 of ``key``, read as little-endian 16-bit words, so the result is
    the same on every platform and across processes.
    """
    if n <= 0:
        return []
    words = array("H", hashlib.shake_128(key).digest(2 * n))
    if _BIG_ENDIAN:
        words.byteswap()
    return words.tolist()


def mooncake_block_tokens(hash_id: int, n: int = MOONCAKE_BLOCK) -> list[int]:
    """The first ``n`` tokens of Mooncake block ``hash_id`` (``n <= 512``).

    The tokens depend on the id only (never on the request or the position), so
    equal ids give equal tokens and a partial block is a prefix of the full one.
    The first token is the id itself and the other 511 are pseudo-random in
    ``[0, 65536)``, so blocks with different ids differ from their first token
    on: no two requests share more than the trace says, at any block size.
    """
    if n <= 0:
        return []
    return [hash_id] + fresh_tokens(b"kvcy-mooncake-block:%d" % hash_id, MOONCAKE_BLOCK - 1)[: n - 1]


def mooncake_prompt(hash_ids: tuple[int, ...], input_length: int) -> list[int]:
    """The prompt token ids of a Mooncake request (``input_length`` tokens)."""
    out: list[int] = []
    left = input_length
    for h in hash_ids:
        n = MOONCAKE_BLOCK if left >= MOONCAKE_BLOCK else left
        out += mooncake_block_tokens(h, n)
        left -= n
    return out


@dataclass(eq=False)
class TraceRequest:
    """One request of a trace.

    Attributes:
        request_id: unique id (``"r<line index>"`` for Mooncake files).
        arrival_ms: arrival time in milliseconds since the trace start.
        num_prompt_tokens: prompt length.
        num_output_tokens: how many tokens the request generates before it
            finishes (the trace's output length; at least 1).
        hash_ids: Mooncake block ids describing the prompt (empty when
            ``prompt`` is given).
        prompt: explicit prompt token ids (synthetic traces).
        output: explicit output token ids (synthetic multi-turn traces, so that a
            follow-up turn can contain them); ``None``: fresh tokens.
        index: position in the trace.
    """

    request_id: str
    arrival_ms: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] = ()
    prompt: list[int] | None = None
    output: list[int] | None = None
    index: int = 0

    def prompt_token_ids(self) -> list[int]:
        """The prompt's token ids (built on demand for Mooncake requests)."""
        if self.prompt is not None:
            return list(self.prompt)
        return mooncake_prompt(self.hash_ids, self.num_prompt_tokens)

    def output_token_ids(self) -> list[int]:
        """The tokens the request generates, in order (fresh unless given)."""
        if self.output is not None:
            return list(self.output)
        return fresh_tokens(b"kvcy-output:%s" % self.request_id.encode(), self.num_output_tokens)


@dataclass
class Trace:
    """A named list of requests in arrival order.

    Attributes:
        name: short name for reports.
        requests: the requests, sorted by arrival (ties keep file order).
        source: where it came from (a path, ``"bundled"``, or a generator spec).
        total_in_source: how many requests the source holds (before ``limit``).
    """

    name: str
    requests: list[TraceRequest]
    source: str = ""
    total_in_source: int = 0
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_output_tokens for r in self.requests)


def hit_rate_upper_bound(trace: Trace, block_size: int) -> float | None:
    """Prefix-cache hit rate if every earlier request's prompt blocks stayed cached.

    Computed from Mooncake ``hash_ids`` alone (``None`` for traces without
    them): a request hits its longest run of leading ids seen before, never its
    last token, rounded down to ``block_size``.  An infinite pool reaches it
    unless a request arrives before the one it shares with has been prefilled.
    """
    if not trace.requests or any(not r.hash_ids for r in trace.requests):
        return None
    seen: set[int] = set()
    hits = queries = 0
    for r in trace.requests:
        n = r.num_prompt_tokens
        covered = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            covered += MOONCAKE_BLOCK
        hits += min(covered, n - 1) // block_size * block_size
        queries += n
        seen.update(r.hash_ids)
    return hits / queries if queries else 0.0


def bundled_trace_path() -> Path:
    """Path of the Mooncake trace head shipped with kvcy (see its PROVENANCE.md)."""
    ref = resources.files("kvcy") / "data" / "traces" / BUNDLED_TRACE
    path = Path(str(ref))
    if not path.is_file():
        raise FileNotFoundError(f"the bundled trace is missing from this install: {path}")
    return path


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


class _MooncakeRow(msgspec.Struct, frozen=True, gc=False):
    """One line of a Mooncake trace; msgspec checks the types and ranges as it decodes.

    JSON has no NaN or Infinity, so a timestamp is always a finite number.
    """

    timestamp: Annotated[float, msgspec.Meta(ge=0, le=MAX_ARRIVAL_MS)]
    input_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_PER_REQUEST)]
    output_length: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS_PER_REQUEST)]
    hash_ids: list[Annotated[int, msgspec.Meta(ge=0, le=_MAX_HASH_ID)]]

    def __post_init__(self) -> None:
        expected = -(-self.input_length // MOONCAKE_BLOCK)
        if len(self.hash_ids) != expected:
            raise ValueError(
                f"{len(self.hash_ids)} hash_ids for input_length {self.input_length} "
                f"(expected {expected}, one per {MOONCAKE_BLOCK} tokens)"
            )


_decode_row = msgspec.json.Decoder(_MooncakeRow).decode


def read_mooncake(path: str | Path, limit: int | None = None, name: str | None = None) -> Trace:
    """Read a Mooncake trace (JSON Lines, optionally gzipped).

    Each line: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (one per 512-token block, ``ceil(input_length / 512)`` of them).
    An ``output_length`` of 0 is read as 1 (a request always samples one token).

    Args:
        path: the ``.jsonl`` or ``.jsonl.gz`` file.
        limit: read only the first ``limit`` requests.
        name: report name (default: the file name without extensions).

    Raises:
        FileNotFoundError: no such file.
        TypeError: ``limit`` is not an int or None.
        ValueError: a negative ``limit``; a path that is not a regular file; a ``.gz`` file that
            is not gzip or is cut short; a line longer than :data:`MAX_LINE_BYTES`; or a malformed
            line: not JSON, or a field of the wrong type or out of range (the message names the
            line and the field, as msgspec reports it: ``t.jsonl line 7: Expected `int` >= 1 -
            at `$.input_length```).  Each message names the file.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    if not path.is_file():
        raise ValueError(f"trace {str(path)!r} is not a regular file")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}: {limit!r}")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
    requests: list[TraceRequest] = []
    total = 0
    try:
        with _open_binary(path) as f:
            total = _read_rows(f, path, limit, requests)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # a .gz that is not gzip, or cut short
        raise ValueError(f"{path.name}: not a whole gzip file ({exc})") from None
    # Arrivals come in buckets; a stable sort keeps file order within a bucket.
    requests.sort(key=lambda r: r.arrival_ms)
    if name is None:
        name = path.name.split(".")[0]
    return Trace(name=name, requests=requests, source=str(path), total_in_source=total)


def _read_rows(f: io.BufferedIOBase, path: Path, limit: int | None, requests: list[TraceRequest]) -> int:
    """Append the rows of ``f`` to ``requests`` (up to ``limit``); return the rows in the file."""
    total = 0
    lineno = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return total
        lineno += 1
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"{path.name} line {lineno}: longer than {MAX_LINE_BYTES:,} bytes: not a trace row")
        if not line.strip():
            continue
        total += 1
        if limit is not None and len(requests) >= limit:
            continue
        try:
            row = _decode_row(line)
        except msgspec.DecodeError as exc:  # and its ValidationError
            raise ValueError(f"{path.name} line {lineno}: {exc}") from None  # JSON is malformed: ...
        index = len(requests)
        requests.append(
            TraceRequest(
                request_id=f"r{index}",
                arrival_ms=row.timestamp,
                num_prompt_tokens=row.input_length,
                num_output_tokens=max(1, row.output_length),
                hash_ids=tuple(row.hash_ids),
                index=index,
            )
        )
