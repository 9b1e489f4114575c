"""The ``kvcy`` command: ``kvcy replay ...`` and ``kvcy plan ...``."""

from __future__ import annotations

import argparse
import sys

_COMMANDS = {
    "replay": ("kvcy.sim.cli", "replay a request trace through the KV-cache manager"),
    "plan": ("kvcy.plan", "how many KV-cache blocks, tokens and requests fit in memory"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a sub-command's own ``main(argv)``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="kvcy", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and the live implementation")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in _COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] == "--version":
        import kvcy

        print(f"kvcy {kvcy.__version__} ({kvcy.IMPLEMENTATION})")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        parser.error(f"unknown command {name!r}; choose from {', '.join(_COMMANDS)}")
    import importlib

    module = importlib.import_module(_COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
