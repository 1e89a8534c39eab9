# The agent image: the static nftpolicy binary at /nftpolicy (the entrypoint,
# run as root) plus Debian's nft and the shared libraries it loads, from the
# Debian packages (hack/release/debs.txt) of the target architecture: the
# same files as the image of `make release` (hack/release.sh), which builds
# both architectures without Docker.
# Build: docker build -t ghcr.io/nftpolicy/nftpolicy:v0.1.0 .
#        docker buildx build --platform linux/amd64,linux/arm64 -t IMAGE .
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETARCH=amd64
ARG COMMIT=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN staging=$(bash hack/release/debs.sh "$TARGETARCH" /tmp/debs) \
 && CGO_ENABLED=0 GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -buildid= -X github.com/nftpolicy/nftpolicy/pkg/version.Version=$(cat VERSION) -X github.com/nftpolicy/nftpolicy/pkg/version.Commit=$COMMIT" \
      -o /out/nftpolicy ./cmd/nftpolicy \
 && go run ./hack/release rootfs -arch "$TARGETARCH" -staging "$staging" -out /rootfs \
      -elf /usr/sbin/nft -file /etc/protocols -file /etc/services -add /nftpolicy=/out/nftpolicy

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /
ENTRYPOINT ["/nftpolicy"]
