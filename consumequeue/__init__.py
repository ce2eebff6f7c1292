"""Consume queues and the key index built from committed entries (later issues)."""
