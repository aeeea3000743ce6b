# syntax=docker/dockerfile:1
# tollgate's container image: `docker compose up` (docker-compose.yml) runs it with Redis and a demo upstream.

# --- build ------------------------------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /build

# Dependencies first, against stub sources: this layer is rebuilt only when a Cargo.toml, Cargo.lock or benches/
# change, not on every edit of the sources (the gateway's src/ and the workspace's crates/). Cargo reads every target the manifest declares before building any, so the
# `[[bench]]` files must be there too (they are not compiled by `cargo build`). tests/docker_compose.rs runs these
# steps in a context laid out as these COPY lines say, so a file missing here fails the suite.
COPY Cargo.toml Cargo.lock ./
COPY crates/limiter/Cargo.toml ./crates/limiter/
COPY benches ./benches
RUN mkdir src crates/limiter/src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs crates/limiter/src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src crates/limiter/src

COPY src ./src
COPY crates ./crates
# COPY keeps the files' own times, which may be older than the stubs' build: touch them so cargo rebuilds the crates.
RUN touch src/main.rs src/lib.rs crates/limiter/src/lib.rs \
 && cargo build --release --locked \
 && cp target/release/tollgate /usr/local/bin/tollgate

# --- run --------------------------------------------------------------------------------------------------------
FROM debian:bookworm-slim
# CA certificates for rediss:// (TLS) stores.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin tollgate

COPY --from=builder /usr/local/bin/tollgate /usr/local/bin/tollgate
# The shipped example config; docker-compose.yml mounts the repository's copy over it.
COPY gateway.yaml /etc/tollgate/gateway.yaml

USER tollgate
# 8080: the gateway (gateway.yaml's `listen`, TOLLGATE_LISTEN). 9901: the admin listener, which gateway.yaml binds
# to 127.0.0.1, so it answers only inside the container unless a config binds it elsewhere (with admin.token).
EXPOSE 8080 9901
ENV RUST_LOG=info
ENTRYPOINT ["tollgate"]
CMD ["--config", "/etc/tollgate/gateway.yaml"]
