"""``python -m bench``: see `bench._run`."""

import sys

from bench._run import main

sys.exit(main())
