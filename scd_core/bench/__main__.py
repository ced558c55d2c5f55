"""`python -m scd_core.bench ...`: see scd_core/bench/cli.py."""

from .cli import main

main()

