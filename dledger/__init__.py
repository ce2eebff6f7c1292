"""DLedger: a Raft-replicated log (store, core protocol, runtime)."""
