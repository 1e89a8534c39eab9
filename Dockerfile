# The agent image: the static nftpolicy binary plus the nft binary it drives.
# Build: docker build -t ghcr.io/nftpolicy/nftpolicy:v0.1.0 .
# Without Docker, hack/image.sh builds the same content as an image tarball.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/nftpolicy ./cmd/nftpolicy

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/nftpolicy /nftpolicy
ENTRYPOINT ["/nftpolicy"]
