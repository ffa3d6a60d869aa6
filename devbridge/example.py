"""The README example's old import path: it lives in `devbridge.apps.example` now."""

from devbridge.apps.example import (
    ExampleReport,
    JitReport,
    run_example,
    run_jit_example,
    settle,
)

__all__ = [
    "ExampleReport",
    "JitReport",
    "run_example",
    "run_jit_example",
    "settle",
]
