"""The lifecycle core: the spec compiled to a table, and the sans-I/O core that decides by it.

Pure: no device work, no threads, and none of numpy, tinygrad or transitions (import-linter's
contracts in pyproject). The spec as a `transitions.Machine` is in `devbridge.models.machine`.
"""

from devbridge.statemachine.core import Allocation, Effect, Effects, InFlight, LifecycleCore, Plan
from devbridge.statemachine.machine import Table, compile_table, default_table

__all__ = [
    "Allocation",
    "Effect",
    "Effects",
    "InFlight",
    "LifecycleCore",
    "Plan",
    "Table",
    "compile_table",
    "default_table",
]
