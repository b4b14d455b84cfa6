"""The controller's HTTP side: the FastAPI app and its routers, authentication, report
ingest and its fast path, the status page (ui/). Imports loop/ and db/, never the other way
(pyproject.toml [tool.importlinter])."""
