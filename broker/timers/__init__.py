"""Delay messages (docs/producing.md, "Delay messages"): a replicated timer over the log."""
