"""The ``kvcy`` command and the argument types its sub-commands share.

``kvcy replay ...`` lives in :mod:`kvcy.sim.cli`, ``kvcy plan ...`` in
:mod:`kvcy.plan`; each module adds its argparse sub-parser with ``add_parser``,
which names the module's ``run`` with ``set_defaults(func=run)``: argparse
picks the sub-command and :func:`main` calls ``args.func(args)``.  Both take sizes and counts through
the one set of parsers below, so ``32GiB`` or ``0`` means the same (and is
refused the same way) in every command.

Exit status everywhere: 0 done, 1 the run itself failed (a plan that does not
fit, two implementations that disagree), 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
import sys

__all__ = [
    "MAX_MEMORY_BYTES",
    "dtype_arg",
    "float_arg",
    "int_arg",
    "main",
    "parse_size",
    "positive_int",
    "size_arg",
]

#: The modules whose ``add_parser`` adds a sub-command (``replay``, ``plan``).
_COMMAND_MODULES = ("kvcy.sim.cli", "kvcy.plan")

#: The largest memory size accepted (1 PiB): anything above is a typo, not a GPU.
MAX_MEMORY_BYTES = 1 << 50

_SIZE_RE = re.compile(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}


def parse_size(text: str) -> int:
    """Bytes in a memory size: ``32GiB``, ``32G`` and ``32Gi`` (binary), ``40GB`` (decimal), ``5e9``, ``4096``.

    Units are case-insensitive; a fraction is rounded down to whole bytes.

    Raises:
        ValueError: not a size, or not between 1 byte and 1 PiB.
    """
    match = _SIZE_RE.fullmatch(str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a memory size: {text!r} (e.g. 32GiB, 512MiB, 40GB, 5e9, 1073741824)")
    number = float(match.group(1))
    if not math.isfinite(number):
        raise ValueError(f"not a memory size: {text!r} (the number is too large)")
    value = number * _SIZE_UNITS[match.group(2).lower()]
    if value > MAX_MEMORY_BYTES:
        raise ValueError(f"memory size {text!r} is larger than 1 PiB")
    if value < 1:
        raise ValueError(f"memory size must be at least 1 byte, got {text!r}")
    return int(value)


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type``."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def int_arg(minimum: int, maximum: int | None = None, why: str = ""):
    """An argparse ``type``: an integer in ``[minimum, maximum]``; ``why`` is added to the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            if maximum is not None:
                wanted = f"an integer from {minimum} to {maximum:,}"
            elif minimum == 1:
                wanted = "a positive integer"
            else:
                wanted = f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"expected {wanted}{why}, got {text!r}")
        return value

    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


#: An integer >= 1, as an argparse ``type``.
positive_int = int_arg(1)


def float_arg(minimum: float, maximum: float, *, include_minimum: bool = True):
    """An argparse ``type``: a finite number in ``[minimum, maximum]``.

    Without ``include_minimum`` the range is ``(minimum, maximum]``.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value >= minimum if include_minimum else value > minimum
        if not (low_ok and value <= maximum):  # NaN fails both
            low = "[" if include_minimum else "("
            raise argparse.ArgumentTypeError(
                f"expected a number in {low}{minimum:g}, {maximum:g}], got {text!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


def dtype_arg(text: str) -> str:
    """An argparse ``type``: a dtype name kvcy knows (``bfloat16``, ``fp8``, ...), checked when
    given, whether or not the run then needs its size."""
    from kvcy.kv_cache_interface.dtypes import canonical_dtype

    try:
        canonical_dtype(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


#: What argparse takes for a negative number rather than an option: any ``-`` then a digit
#: (``-3x``, ``-1e5``, ``-2GiB``), so ``--cpu-offload -3x`` reaches the option's own check and
#: its message instead of "expected one argument".  No option of kvcy starts with a digit.
_NEGATIVE_NUMBER = re.compile(r"-\.?[0-9]")


def build_parser() -> argparse.ArgumentParser:
    """The ``kvcy`` parser with every sub-command's parser."""
    import kvcy

    parser = argparse.ArgumentParser(
        prog="kvcy",
        description="kvcy: vLLM 0.33.0's v1 KV-cache manager with compiled hot paths. "
        "Run 'kvcy COMMAND --help' for a command's options.",
    )
    parser.add_argument(
        "--version", action="version", version=f"kvcy {kvcy.__version__} ({kvcy.IMPLEMENTATION})",
        help="print the version and the live implementation (cython or python), then exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(sub)
    for command in (parser, *sub.choices.values()):
        command._negative_number_matcher = _NEGATIVE_NUMBER  # argparse's own: "-3" but not "-3x"
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kvcy``; return the exit status (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    prog = parser.prog
    try:
        args = parser.parse_args(argv)
        prog = f"{parser.prog} {args.command}"
        return int(args.func(args) or 0)
    except SystemExit as exc:  # argparse has printed the usage and the message (or the help)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
