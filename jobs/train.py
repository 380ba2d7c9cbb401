"""Train a timm model with raypipe on Ray. With no arguments: sample data, a small model, a few minutes.

    python jobs/train.py                                   # local Ray, embedded default job
    ray job submit --working-dir . -- python jobs/train.py -c jobs/configs/resnet50_imagenet.yaml …

Thin on purpose: parse, connect, hand over to ``raypipe.train``.
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # `import raypipe` without `pip install` (a checkout, or Ray's working_dir)
    sys.path.insert(0, REPO)
# Workers of a Ray that this process starts inherit its environment, so they find the package too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)


def main(argv: list[str] | None = None) -> int:
    from raypipe.ray_logs import hide_worker_lines, quiet_ray_startup
    from raypipe.train.args import parse_job_args

    job, args = parse_job_args(argv)  # imports no Ray: Ray reads what hide_worker_lines sets at import
    hide_worker_lines(verbose=args.verbose)

    from raypipe.pipeline.accounting import SkipLimitError
    from raypipe.runtime import connect
    from raypipe.train import run_training

    try:
        with quiet_ray_startup(verbose=args.verbose):  # e.g. that token auth is on: Ray's default, and fine
            # Ray Train's placement-group cleaner asks the dashboard's State API
            connect(dashboard=True, quiet=not args.verbose)
        run_training(job, verbose=args.verbose)
    except SkipLimitError as e:  # the data is mostly broken: its own short message says what to do
        print(f"train.py: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, ConnectionError, TimeoutError) as e:  # configuration, data, an unreachable cluster
        print(f"train.py: error: {e}", file=sys.stderr)  # or store: a clear message, no traceback
        return 2
    except KeyboardInterrupt:  # Ray Train's own "aborting" line is below the console's WARNING level
        print("train.py: interrupted (the checkpoints written so far are kept)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    from raypipe.timeouts import exit_process  # as the raypipe command ends: see its doc

    exit_process(main())
