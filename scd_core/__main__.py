"""`python -m scd_core ...`: see scd_core/cli.py."""

import sys

from .cli import main

sys.exit(main())
