"""One measurement each, behind a figure in the docs or a constant in raypipe (the text that quotes it
names the command); the measuring code is in ``raypipe.benchmark`` (``machine``, ``ray_costs``,
``stage_costs``, ``s3``, ``remote_folder``, ``listing``)::

    python bench/profiles.py --help               # every measurement, one line each
    python bench/profiles.py slab-cost --help     # what one measures, and its options
"""

from __future__ import annotations

import argparse
import inspect

from raypipe.benchmark import listing, machine, ray_costs, remote_folder, s3, stage_costs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="measurement", required=True, metavar="MEASUREMENT")

    def add(name: str, fn) -> argparse.ArgumentParser:
        doc = inspect.cleandoc(fn.__doc__)
        sp = sub.add_parser(
            name, help=doc.splitlines()[0], description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        sp.set_defaults(fn=fn)
        return sp

    for module in (machine, ray_costs, stage_costs, s3, remote_folder, listing):
        module.register(add)
    args = vars(p.parse_args(argv))
    fn = args.pop("fn")
    del args["measurement"]
    fn(**args)


if __name__ == "__main__":
    main()
