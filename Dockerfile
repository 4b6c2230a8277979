# The `portcullis` image (docker-compose.yml builds it too). Checked by scripts/check-container
# (part of scripts/test.sh): non-root user, owned data directory, ports = config/container.toml.
#
#   docker build -t portcullis:0.1.0 .
#   docker run --rm -p 8080:8080 -p 127.0.0.1:8081:8081 -e PORTCULLIS_ADMIN_TOKEN=… \
#     -v portcullis-data:/var/lib/portcullis portcullis:0.1.0

# --- build -------------------------------------------------------------------------------
# The toolchain the repository is tested with; bookworm, as the runtime stage (same glibc).
FROM rust:1.95-bookworm AS build
WORKDIR /src
# No debug info in the image's binary (the release profile keeps line tables for profiling:
# ~96 MB of a 126 MB binary); symbols stay, so a panic's backtrace still names functions.
# Set before the first build so the dependency layer is built the same way.
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo

# Dependency-cache layer: the manifests and the lock file with stub sources, so the external
# crates compile once and stay cached until a manifest or Cargo.lock changes. Every target a
# manifest declares gets a stub (cargo refuses a workspace with a missing bench or test
# file): scripts/stub-targets derives them from the manifests.
COPY Cargo.toml Cargo.lock ./
COPY gateway/Cargo.toml gateway/
COPY control/Cargo.toml control/
COPY problem/Cargo.toml problem/
COPY ratelimit/Cargo.toml ratelimit/
COPY idempotency/Cargo.toml idempotency/
COPY redis/Cargo.toml redis/
COPY retry/Cargo.toml retry/
COPY queue/Cargo.toml queue/
COPY tests/support/Cargo.toml tests/support/
COPY scripts/stub-targets scripts/
RUN sh scripts/stub-targets \
    && cargo build --release --locked -p portcullis-gateway --bin portcullis

# The sources. Their files may be older than the stub build's outputs, so touch them: cargo
# decides freshness by modification time and would otherwise keep the stub binary.
COPY . .
RUN find gateway control problem ratelimit idempotency redis retry queue tests/support \
      -name '*.rs' -exec touch {} + \
    && cargo build --release --locked -p portcullis-gateway --bin portcullis \
    && cp target/release/portcullis /usr/local/bin/portcullis

# --- runtime -----------------------------------------------------------------------------
FROM debian:bookworm-slim
# curl for the HEALTHCHECK; ca-certificates for https:// upstreams (system roots).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 portcullis \
    && useradd --system --uid 10001 --gid portcullis --home-dir /var/lib/portcullis \
       --shell /usr/sbin/nologin portcullis \
    && mkdir -p /var/lib/portcullis \
    && chown portcullis:portcullis /var/lib/portcullis \
    && chmod 0750 /var/lib/portcullis
COPY --from=build /usr/local/bin/portcullis /usr/local/bin/portcullis
COPY config/ /etc/portcullis/
# The SQLite file (tenants, keys, quotas, audit log) lives here; the directory exists and is
# owned by the runtime user before the volume is declared, so a fresh named volume starts
# with that ownership (WORKDIR alone would create it root-owned).
VOLUME ["/var/lib/portcullis"]
WORKDIR /var/lib/portcullis
USER 10001:10001
# Proxy and admin (/healthz, /readyz, /metrics, admin API): config/container.toml.
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8081/readyz"]
# SIGTERM drains: in-flight requests get server.shutdown_grace (8 s in container.toml), which
# must end before the engine's stop timeout (Docker's default 10 s; `docker run
# --stop-timeout`, compose `stop_grace_period`) kills the process (scripts/check-container).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/portcullis"]
CMD ["--config", "/etc/portcullis/container.toml"]
