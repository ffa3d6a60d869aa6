"""The Bridge (`bridge`), built with its engine (`engine`), which executes the core's decisions
on a backend; its events (`events`, `aio`), copies (`transfer`), statistics (`stats`, `memory`)
and trace (`trace`)."""
