"""``make bench-peers``: LedgerMQ next to NATS JetStream, etcd, pysyncobj and the HTTP floor.

One command (``bench/peers_bench.py``) installs the peers if they are missing
(``install``), starts every system with three replicas on 127.0.0.1 (``systems``),
drives each scenario from one load generator process (``loadgen``, built on
``bench/http_bench.py``'s), alternating LedgerMQ and peer runs, kills masters
(``failover``), restarts nodes on a full log (``recovery``), samples the machine during
every run (``machine``) and writes JSON, a Markdown table and PNG charts (``report``).
See bench/README.md.
"""
