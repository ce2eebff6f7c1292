"""LedgerMQ above the broker: the client (``ledgermq.client``, which imports nothing else
of ours), the PySpark data source (``ledgermq.spark``, over the client), the CLI
(``ledgermq.cli``), the node process (``ledgermq.node``: the composition root of one
node, ``python -m ledgermq`` or ``ledgermq broker``), local clusters of node processes
(``ledgermq.local_cluster``, ``ledgermq.processes``), the replica comparison
(``ledgermq.replicas``) and the failover demo (``ledgermq.demo``). The layers it stands
on: ``api`` (the network fronts), ``broker``, ``consumequeue`` and ``dledger``."""
