"""Entry point of the `convmem` console script."""

from __future__ import annotations

import sys

from convmem.adapters._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
