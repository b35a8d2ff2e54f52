# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run on distroless as non-root
# (UID 65532, as the Helm chart's securityContext expects).

FROM rust:1.88-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source changes do not rebuild them. The workspace's
# other members (the load generator, the checker, the test kit) are not
# built: only their manifests are needed to read the workspace
# (tests/shipping/dockerfile.rs lays this layer out and loads it).
COPY Cargo.toml Cargo.lock build.rs ./
COPY bench/Cargo.toml bench/Cargo.toml
COPY check/Cargo.toml check/Cargo.toml
COPY clients/rust/Cargo.toml clients/rust/Cargo.toml
COPY testkit/Cargo.toml testkit/Cargo.toml
COPY proto proto
# Cargo.toml names the benchmark targets, so their files must exist.
COPY benches benches
RUN mkdir -p src bench/src check/src clients/rust/src testkit/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > bench/src/main.rs \
    && echo 'fn main() {}' > check/src/main.rs && touch check/src/lib.rs \
    && touch clients/rust/src/lib.rs testkit/src/lib.rs \
    && cargo build --release --locked -p watchproxy --bin watchproxy || true
COPY src src
# The commit watchproxy_build_info names: docker build --build-arg WATCHPROXY_GIT=$(git rev-parse --short=12 HEAD)
ARG WATCHPROXY_GIT=unknown
# The command line's get, list and watch are made through the Rust client.
COPY clients/rust/build.rs clients/rust/build.rs
COPY clients/rust/proto clients/rust/proto
COPY clients/rust/src clients/rust/src
RUN touch src/main.rs src/lib.rs clients/rust/src/lib.rs && cargo build --release --locked -p watchproxy --bin watchproxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/watchproxy /usr/local/bin/watchproxy
USER 65532:65532
EXPOSE 50051 9091
# The chart mounts the configuration here; see examples/config.yaml.
ENTRYPOINT ["/usr/local/bin/watchproxy"]
CMD ["serve", "--config", "/etc/watchproxy/config/config.yaml", "--log-format", "json"]
