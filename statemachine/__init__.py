"""The lifecycle core: the spec compiled to a table, and the sans-I/O core that decides by it.

Pure: no device work, no threads, and none of numpy, tinygrad or transitions (import-linter's
contracts in pyproject). The spec as a `transitions.Machine` is in `devbridge.models.machine`.
"""

from typing import Any

from devbridge.statemachine.core import Allocation, Effects, Executor, InFlight, LifecycleCore, Plan
from devbridge.statemachine.machine import Table, compile_table, default_table


def __getattr__(name: str) -> Any:
    """`build_machine`, moved to devbridge.models.machine: served here for one release."""
    from devbridge.statemachine.machine import moved

    return moved(name, __name__)


__all__ = [
    "Allocation",
    "Effects",
    "Executor",
    "InFlight",
    "LifecycleCore",
    "Plan",
    "Table",
    "compile_table",
    "default_table",
]
