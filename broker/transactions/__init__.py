"""Transactional messages (docs/http.md, "Transactions"): half messages, commit, rollback
and checks, replicated through the log."""
