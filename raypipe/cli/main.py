"""The ``raypipe`` console script: one command-line contract for every command.

Exit status:

- 0: done.
- 1: the command ran and failed: an epoch exceeded its skip limit (``SkipLimitError``), a shard changed
  since it was listed (``ShardChangedError``), a Ray worker, node or feeder was lost, a Ray task raised;
  or ``scan`` found images it could not read. One short message on stderr that names the underlying
  exception's type.
- 2: a user error: a bad path, flag value or YAML file (``ValueError``, ``OSError``, argparse's own
  checks), found before anything starts where it can be. One line on stderr.
- 130: interrupted.

``--debug`` adds the traceback to any error; ``--verbose`` shows Ray's start-up messages and INFO logs.
Nothing heavy (Ray, torch, timm, pyarrow) is imported until a command runs, so ``--help`` and
``--version`` are fast.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import logging
import sys
import traceback

from raypipe import __version__, timeouts

__all__ = ["main", "build_parser", "COMMANDS", "HelpFormatter", "ArgumentParser"]

# Modules under raypipe.cli, one per command, in the order --help lists them.
COMMANDS = ("sample", "scan", "run", "preview", "convert", "index", "bench", "cluster_check")

_MAX_FAILURE_LINES = 6
# raypipe's own "the run failed" exceptions, by module (checked only once their module is imported).
_RUN_FAILURES = (
    ("raypipe.pipeline.accounting", "SkipLimitError"),
    ("raypipe.pipeline.feeder", "FeederDiedError"),
    ("raypipe.sources.formats.tar_members", "ShardChangedError"),
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default when it has a real one; flags that default to None ("not given": the
    config decides) say their default in their own help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "(default" in text:
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints a usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_global_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    # On the top parser and on each command, so `raypipe --debug run …` and `raypipe run … --debug` both
    # work; the commands' copies default to SUPPRESS so they do not reset a value given before them.
    default = False if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=default, help="show the traceback of an error")
    p.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="show Ray's start-up messages and INFO logs"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="raypipe", description="Ray-distributed image preprocessing for PyTorch", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"raypipe {__version__}")
    _add_global_flags(parser, top=True)
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="run `raypipe COMMAND --help` for its flags",
        parser_class=functools.partial(ArgumentParser, formatter_class=HelpFormatter),
    )
    for name in COMMANDS:
        importlib.import_module(f"raypipe.cli.{name}").add_parser(sub)
    for command in sub.choices.values():
        _add_global_flags(command, top=False)
    return parser


def _failure_kind(exc: BaseException) -> str:
    """'failed' (exit 1) for a run that went wrong, 'user' (exit 2) for a bad argument or input."""
    # Only what is already imported can have raised: checking never imports Ray here.
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is not None and isinstance(exc, ray_exceptions.RayError):
        return "failed"  # before ValueError: a Ray task's ValueError is raised as a subclass of both
    if _is_run_failure(exc):
        return "failed"
    yaml = sys.modules.get("yaml")
    if isinstance(exc, (ValueError, OSError)) or (yaml is not None and isinstance(exc, yaml.YAMLError)):
        return "user"
    return "failed"


def _is_run_failure(exc: BaseException) -> bool:
    """One of raypipe's own "the run failed" exceptions (only modules already imported can have raised)."""
    for module, name in _RUN_FAILURES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def _underlying(exc: BaseException) -> BaseException:
    """The exception a Ray task raised (its own type and message), else ``exc``."""
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is not None and isinstance(exc, ray_exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


def _lines(exc: BaseException) -> list[str]:
    return [line.rstrip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]


def _report(prog: str, exc: BaseException, *, debug: bool) -> int:
    kind = _failure_kind(exc)
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if kind == "user":
        print(f"{prog}: error: {' '.join(_lines(exc))}", file=sys.stderr)
        return 2
    inner = _underlying(exc)
    lines = _lines(inner)
    first = f"{type(inner).__name__}: {lines[0]}"
    if inner is not exc:
        first += f" (raised in a Ray task, {type(exc).__name__})"
    # raypipe's own failures are written short, with what to do last: shown whole
    keep = len(lines) if _is_run_failure(inner) else _MAX_FAILURE_LINES
    out = [f"{prog}: failed: {first}", *("  " + line for line in lines[1:keep])]
    if len(lines) > keep:
        out.append(f"  … {len(lines) - keep} more lines")
    if not debug and not _is_run_failure(inner):  # our own failures say what to do; no traceback helps
        out.append(f"{prog}: run with --debug for the traceback")
    print("\n".join(out), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prog = f"raypipe {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every error ends as a short message and an exit status
        status = _report(prog, exc, debug=args.debug)
    # The failed run's objects (an epoch's generators, a chunk stream and its threads) sit in reference cycles
    # through the traceback: collect them here, on the main thread, not whenever and wherever the
    # collector next runs (on one of those threads, an epoch's clean-up cannot join it).
    gc.collect()
    return status


def console_main() -> None:
    """The ``raypipe`` command: ``main``, then the exit with its status (``timeouts.exit_process``: at
    once, output flushed, where a wait that timed out left a thread in a network client's code)."""
    timeouts.exit_process(main())


if __name__ == "__main__":
    console_main()
