"""Host rings: the in-process ring (`host`), the shared-memory ring across processes (`shared`)
over its segment (`segment`), and the staging buffers copies read from (`buffers`)."""
