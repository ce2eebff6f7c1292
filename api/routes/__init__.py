"""The HTTP API's routes, one module-level ``router`` per file (docs/http.md): probes,
prometheus (``/metrics``), cluster, topics, messages (produce, pull, offset by time),
query, groups. Each route is a module-level function (``api.routes.messages.produce``);
it reaches its node (broker, settings, limits, metrics, long polls, the token's grant)
through the dependencies of ``common``, which read ``request.app.state``, so the same
routers serve every app of the process. ``api.app.create_app`` includes them."""
