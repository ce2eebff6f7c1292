"""The DLedger runtime: wire format, asyncio TCP transport, node loop and server."""
