"""The `convmem` command line: `main` is the console script's entry point.

`_main` builds the parser and runs a command; `_common` holds what every
command shares (errors, exit codes, output, progress); `_audit` the auditor's
commands (what `replay` says besides the context in `_replayed`, what an "as of" time
covers in `_as_of`), `_demo` the demo and `_serve` the service and its status;
`_workers` runs and supervises the worker processes of `serve --workers`.
"""

from convmem.adapters.frontends.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
