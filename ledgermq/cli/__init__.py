"""The ``ledgermq`` command: ``main`` (the parser and the server commands: broker, cluster,
demo, bench), ``client`` (the client commands), ``util`` (options shared with the node
process). Nothing is imported here, so the node process can use ``util`` without the
command line importing the node back."""
