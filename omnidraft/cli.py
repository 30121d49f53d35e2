"""`omnidraft` console entry point.

Each subcommand lives in ``omnidraft/commands/<name>.py`` and defines ``HELP: str``,
``add_arguments(parser)`` and ``run(args) -> int``. Errors are typed (omnidraft.errors) and caught
here, once: the user sees one line and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from omnidraft import __version__
from omnidraft.errors import OmnidraftError


def _command_modules() -> list[str]:
    import omnidraft.commands as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnidraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"omnidraft {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules():
        module = importlib.import_module(f"omnidraft.commands.{name}")
        p = sub.add_parser(name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def quiet_third_party_logs() -> None:
    # torchao (pulled in by transformers) warns about GPU kernels this CPU build cannot load, and
    # torch's pytree warns about its enums; neither concerns a user of the CLI or the trainer.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    quiet_third_party_logs()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except OmnidraftError as exc:
        print(f"omnidraft {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"omnidraft {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
