"""`python -m scd_core ...`: see scd_core/frontends/cli.py."""

import sys

from .frontends.cli import main

sys.exit(main())
