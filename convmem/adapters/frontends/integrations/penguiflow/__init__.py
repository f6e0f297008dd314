"""PenguiFlow's short-term memory on convmem: a drop-in `DefaultShortTermMemory` and the older
singleton `ConvmemShortTermMemory`. The public face is `convmem.penguiflow`.

penguiflow is imported only when a memory is made or `install()` is called.
"""

from convmem.adapters.frontends.integrations.penguiflow._install import install, installed, uninstall
from convmem.adapters.frontends.integrations.penguiflow._memory import DefaultShortTermMemory
from convmem.adapters.frontends.integrations.penguiflow._runtime import (
    ENVIRONMENT,
    close,
    configure,
    current_system,
)
from convmem.adapters.frontends.integrations.penguiflow._singleton import (
    ConvmemShortTermMemory,
    config_from_penguiflow,
    turn_from_penguiflow,
)
from convmem.adapters.frontends.integrations.penguiflow._values import key_from_composite

__all__ = [
    "ENVIRONMENT",
    "ConvmemShortTermMemory",
    "DefaultShortTermMemory",
    "close",
    "config_from_penguiflow",
    "configure",
    "current_system",
    "install",
    "installed",
    "key_from_composite",
    "turn_from_penguiflow",
    "uninstall",
]
