# Multi-stage build of the `portcullis` binary, used by docker-compose.yml.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p portcullis-gateway --bin portcullis

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 portcullis
COPY --from=build /src/target/release/portcullis /usr/local/bin/portcullis
COPY config/ /etc/portcullis/
USER portcullis
WORKDIR /var/lib/portcullis
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/portcullis"]
CMD ["--config", "/etc/portcullis/portcullis.example.toml"]
