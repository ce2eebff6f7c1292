# The LedgerMQ broker image: `ledgermq broker`, every setting from a LEDGERMQ_* variable
# (`docker run --rm ledgermq --help` lists them). docker-compose.yml runs three of them
# and the failover demo; tests/deploy/test_compose.py checks this file's steps without
# an engine (the entry point, the user, the healthcheck command).

# ---- build: the project and its dependencies as wheels (no compiler in the final image)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY broker/ broker/
COPY consumequeue/ consumequeue/
COPY dledger/ dledger/
COPY ledgermq/ ledgermq/
# The RocketMQ 5 protocol modules (api/rocketmq/protocol, not in the repository): the npm
# package's .proto files, checked against their pinned sha512, compiled by grpcio-tools.
COPY tools/protos.py tools/protos.py
RUN pip install --no-cache-dir 'grpcio-tools>=1.85,<2' \
 && python tools/protos.py
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# ---- run
FROM python:3.11-slim
# A fixed, unprivileged uid/gid: named volumes take the data directory's owner from the
# image, and the same numbers on every host keep bind mounts predictable.
RUN groupadd --system --gid 10001 ledgermq \
 && useradd --system --uid 10001 --gid ledgermq --home-dir /var/lib/ledgermq \
        --no-create-home --shell /usr/sbin/nologin ledgermq \
 && mkdir -p /var/lib/ledgermq \
 && chown ledgermq:ledgermq /var/lib/ledgermq
# Installed from the wheels built above, not editable, nothing fetched at this step.
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels /wheels/ledgermq-*.whl \
 && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    LEDGERMQ_HTTP=0.0.0.0:8080 \
    LEDGERMQ_DATA_DIR=/var/lib/ledgermq
# Numeric, so that a runtime checking "not root" (Kubernetes' runAsNonRoot) can tell.
USER 10001:10001
WORKDIR /var/lib/ledgermq
VOLUME ["/var/lib/ledgermq"]
# 8080: the HTTP API; 9080: Raft (the peers' port in LEDGERMQ_PEERS); 10080: RocketMQ 5
# gRPC (LEDGERMQ_GRPC, by default the HTTP port + 2000).
EXPOSE 8080 9080 10080
# Ready = a master is known and this node's dispatch has caught up (GET /readyz, open
# even with --auth-token). The slim image has no curl; Python's urllib does the job.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; port = os.environ.get('LEDGERMQ_HTTP', ':8080').rpartition(':')[2]; u.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2)"]
ENTRYPOINT ["ledgermq", "broker"]
