# syntax=docker/dockerfile:1
# Build: the bundled librdkafka and zstd need a C toolchain; no other system libraries are linked.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY examples ./examples
RUN cargo build --locked --release --bin replay-ingest

# Runtime: slim, non-root, read-only friendly (the chart mounts /tmp). CA certificates for GCS
# over TLS; librdkafka is statically linked into the binary.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 replay && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin replay
COPY --from=build /src/target/release/replay-ingest /usr/local/bin/replay-ingest
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/replay-ingest"]
CMD ["consume"]
