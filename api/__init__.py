"""HTTP API, Python client and Spark data source (later issues)."""
