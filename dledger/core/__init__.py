"""The DLedger protocol as a sans-I/O, deterministic state machine."""
