"""The lifecycle core: the spec as a transitions.Machine, its compiled table, and the sans-I/O core."""

from devbridge.statemachine.core import Allocation, Effects, Executor, InFlight, LifecycleCore, Plan
from devbridge.statemachine.machine import Table, build_machine, compile_table, default_table

__all__ = [
    "Allocation",
    "Effects",
    "Executor",
    "InFlight",
    "LifecycleCore",
    "Plan",
    "Table",
    "build_machine",
    "compile_table",
    "default_table",
]
