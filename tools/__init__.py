"""Development-time generators, run from the repository root: ``python -m tools.docgen``
writes docs/reference (the HTTP API, the CLI and the format examples)."""
