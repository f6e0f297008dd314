"""convmem as PenguiFlow's short-term memory: change one line, keep PenguiFlow's behaviour, gain a log.

``convmem.penguiflow.install()`` makes ReactPlanner build convmem memories
for ``ReactPlanner(short_term_memory=ShortTermMemoryConfig(...))``; code that
builds memories itself imports `DefaultShortTermMemory` from here instead of
``penguiflow.planner.memory``. Memories live in one process-wide
`MemorySystem`, opened on first use on the embedded default, the
``CONVMEM_*`` environment or `configure()`, and closed at exit.
"""

from convmem.adapters.frontends.integrations.penguiflow import (
    ENVIRONMENT,
    DefaultShortTermMemory,
    close,
    configure,
    current_system,
    install,
    installed,
    key_from_composite,
    uninstall,
)

__all__ = [
    "ENVIRONMENT",
    "DefaultShortTermMemory",
    "close",
    "configure",
    "current_system",
    "install",
    "installed",
    "key_from_composite",
    "uninstall",
]
