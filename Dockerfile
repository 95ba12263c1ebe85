# syntax=docker/dockerfile:1
# Three stages: plan (cargo-chef reads the manifests), build (dependencies in a layer of their own,
# rebuilt only when Cargo.toml or Cargo.lock change — librdkafka and every crate — then the
# service), run (distroless, non-root).
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS chef
# librdkafka is built from source (C toolchain, bundled with the crate) and links the system's
# OpenSSL for Kafka TLS and SCRAM; zlib is built into it (rdkafka's `libz-static`): distroless's
# cc images do not promise libz.so.1 (cc-debian13 has none), and without it the binary does not
# start (tests/it/image.rs checks the binary's libraries against the runtime image's packages).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

FROM chef AS plan
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=plan /src/recipe.json recipe.json
# The dependency layer; the registry is a cache mount, so a changed lock refetches only what changed.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo chef cook --release --locked --recipe-path recipe.json --bin replay-ingest
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY examples ./examples
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked --bin replay-ingest

# Runtime: distroless with glibc, libssl and CA certificates (GCS, ClickHouse and Kafka over TLS),
# no shell, running as the image's non-root user (65532). The chart mounts /tmp and keeps the
# root filesystem read-only.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="replay-ingest" \
      org.opencontainers.image.description="Consumes session-replay recording segments from Kafka and stores blobs, rows, events and metrics." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=build /src/target/release/replay-ingest /usr/local/bin/replay-ingest
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/replay-ingest"]
CMD ["consume"]
