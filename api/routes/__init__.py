"""The HTTP API's routes, one ``APIRouter`` per resource (docs/http.md): probes, cluster,
topics, messages (produce, pull, offset by time), query, groups. Each file's ``build``
makes its router (with the node's limits where its parameters need them); routes reach
the node through the dependencies of ``common``."""
