# syntax=docker/dockerfile:1
# One image for every role: `infergate gateway | picker | bbr | operator | sim | bench | crdgen`.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p infergate-cli \
 && cp target/release/infergate /usr/local/bin/infergate

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 65532 --no-create-home infergate
COPY --from=build /usr/local/bin/infergate /usr/local/bin/infergate
USER 65532:65532
# ext_proc picker, gRPC health, metrics, body-based router, gateway
EXPOSE 9002 9003 9090 9004 8080
ENTRYPOINT ["/usr/local/bin/infergate"]
CMD ["--help"]
