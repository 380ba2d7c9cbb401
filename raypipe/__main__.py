"""``python -m raypipe``: the ``raypipe`` console script."""

from raypipe.cli.main import console_main

console_main()
