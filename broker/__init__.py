"""The broker: message codec, DLedgerCommitLog, dispatcher, metadata, roles (later issues)."""
