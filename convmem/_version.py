"""convmem's version (pyproject.toml's; `tests/test_version.py` keeps them equal), on the ground floor
so the adapters that report it need not import the package's face."""

__version__ = "0.1.0"
