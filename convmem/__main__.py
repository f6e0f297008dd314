"""`python -m convmem` runs the command line."""

import sys

from convmem.adapters.cli import main

sys.exit(main())
