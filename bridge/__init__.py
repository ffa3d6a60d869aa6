"""The Bridge (`bridge`): it executes the core's decisions on a backend; its events (`events`),
waits (`waiting`, `aio`), copies (`transfer`), statistics (`stats`, `memory`, `introspection`)
and trace (`trace`)."""
