"""``python -m raypipe``: the ``raypipe`` console script."""

import sys

from raypipe.cli.main import main

sys.exit(main())
