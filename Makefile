# nftpolicy make targets. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
BIN := _output/bin/nftpolicy
PLUGIN := _output/bin/kubectl-nftpolicy
SEEDS ?= 1-60
FUZZTIME ?= 10s
# make test runs every fuzz target briefly (the kept inputs run in go test).
CI_FUZZTIME ?= 5s
LONG_SEEDS ?= 1-500
# make lint: staticcheck at a pinned version, installed under _output (go
# install pkg@version builds outside this module: go.mod stays untouched).
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(CURDIR)/_output/tools/staticcheck@$(STATICCHECK_VERSION)/staticcheck
# make lint: no function longer than FUNCLEN_MAX lines (tables aside) in
# pkg/ and cmd/.
FUNCLEN_MAX ?= 100

.PHONY: all build plugin-cross test test-unit fuzz redteam vet lint tools deps demo bench bench-quick diff diff-long conformance conformance-npa rollout image clean compare

all: build

build:
	$(GO) build -o $(BIN) ./cmd/nftpolicy
	# The kubectl plugin: kubectl runs kubectl-nftpolicy on PATH. Its own
	# binary, without the kernel side (cmd/kubectl-nftpolicy).
	rm -f $(PLUGIN)
	$(GO) build -o $(PLUGIN) ./cmd/kubectl-nftpolicy

# The plugin builds for the operators' machines: macOS and Windows too.
plugin-cross:
	GOOS=darwin GOARCH=arm64 $(GO) build -o $(dir $(BIN))darwin-arm64/kubectl-nftpolicy ./cmd/kubectl-nftpolicy
	GOOS=windows GOARCH=amd64 $(GO) build -o $(dir $(BIN))windows-amd64/kubectl-nftpolicy.exe ./cmd/kubectl-nftpolicy

deps:
	bash hack/deps.sh

tools:
	bash hack/tools.sh

vet:
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

# vet and gofmt, staticcheck, and function lengths (hack/funclen).
lint: vet $(STATICCHECK)
	$(STATICCHECK) ./...
	$(GO) run ./hack/funclen -max $(FUNCLEN_MAX) cmd pkg

$(STATICCHECK):
	GOBIN=$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Unit tests only: no root, no tools.
test-unit:
	$(GO) test ./pkg/... ./cmd/...

# Every fuzz target of the repository, FUZZTIME each (go test -fuzz runs
# one target at a time). Inputs that found a bug are kept under each
# package's testdata/fuzz/<FuzzName>/ and replayed by plain `go test`.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseReply$$' -fuzztime $(FUZZTIME) ./pkg/fqdn
	$(GO) test -run '^$$' -fuzz '^FuzzDNSPayload$$' -fuzztime $(FUZZTIME) ./pkg/fqdn
	$(GO) test -run '^$$' -fuzz '^FuzzStream$$' -fuzztime $(FUZZTIME) ./pkg/fqdn
	$(GO) test -run '^$$' -fuzz '^FuzzHandlePacket$$' -fuzztime $(FUZZTIME) ./pkg/fqdn
	$(GO) test -run '^$$' -fuzz '^FuzzParsePacket$$' -fuzztime $(FUZZTIME) ./pkg/queue
	$(GO) test -run '^$$' -fuzz '^FuzzParseQueueMsg$$' -fuzztime $(FUZZTIME) ./pkg/queue
	$(GO) test -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime $(FUZZTIME) ./pkg/compile
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeKey$$' -fuzztime $(FUZZTIME) ./pkg/nftnl
	$(GO) test -run '^$$' -fuzz '^FuzzDecodePod$$' -fuzztime $(FUZZTIME) ./pkg/slim
	$(GO) test -run '^$$' -fuzz '^FuzzWatchEvent$$' -fuzztime $(FUZZTIME) ./pkg/slim
	$(GO) test -run '^$$' -fuzz '^FuzzEventReader$$' -fuzztime $(FUZZTIME) ./pkg/slim
	$(GO) test -run '^$$' -fuzz '^FuzzSnapshotDecoding$$' -fuzztime $(FUZZTIME) ./pkg/evaluate
	$(GO) test -run '^$$' -fuzz '^FuzzSnapshotPodEncoding$$' -fuzztime $(FUZZTIME) ./pkg/evaluate

# The red-team suite alone (tests/redteam, docs/security.md): every attack
# on the agent enacted on the real kernel; make test runs it too.
redteam: deps tools build
	NFTPOLICY_REQUIRE_TOOLS=1 NFTPOLICY_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v ./tests/redteam

# Everything: lint, unit, real-kernel (root, network namespaces), real API
# server, end-to-end, and the differential check over a fixed seed range.
test: deps tools lint build plugin-cross
	NFTPOLICY_REQUIRE_TOOLS=1 NFTPOLICY_BIN=$(CURDIR)/$(BIN) $(GO) test -timeout 40m ./...
	bash hack/diff.sh --seeds $(SEEDS) --mode hybrid
	bash hack/diff.sh --seeds 1-20 --mode queue
	bash hack/diff.sh --seeds 1-30 --mode hybrid --incremental
	$(MAKE) fuzz FUZZTIME=$(CI_FUZZTIME)

diff:
	bash hack/diff.sh --seeds $(SEEDS) --mode hybrid

# Side by side with kube-network-policies (issue 30, docs/comparison.md):
# builds the peer at a pinned version (patched only where this kernel lacks
# the nft queue expression) and runs both in the real-API lab; prints
# name=value figures; COMPARE_OUT=DIR keeps them, the log and an SVG chart
# of connection rate and latency in DIR.
compare: deps tools build
	bash hack/compare.sh $(if $(COMPARE_OUT),--out $(COMPARE_OUT))

diff-long:
	bash hack/diff.sh --seeds $(LONG_SEEDS) --mode hybrid
	bash hack/diff.sh --seeds 1-100 --mode queue
	bash hack/diff.sh --seeds 1-100 --mode hybrid --incremental

demo: deps tools build
	bash hack/demo.sh

bench: deps tools build
	bash hack/bench.sh

bench-quick: deps tools build
	bash hack/bench.sh --quick

# CONFORMANCE_FLAGS, e.g. '--mode queue', '--nodes 2', '--no-agent', '--focus RE'.
conformance: deps build
	bash hack/conformance.sh $(CONFORMANCE_FLAGS)

# SIG Network's ClusterNetworkPolicy conformance suite (network-policy-api
# v0.3.0) on two nodes; CONFORMANCE_FLAGS as above, e.g. '--mode queue'.
conformance-npa: deps build
	bash hack/conformance.sh --suite npa $(CONFORMANCE_FLAGS)

# A rolling update of the agent's DaemonSet while connections run (two nodes,
# --mode queue unless CONFORMANCE_FLAGS says '--mode hybrid'): no allowed
# connection may fail, no denied one be admitted. 1.5 to 3 minutes.
rollout: deps build
	bash hack/conformance.sh --suite rollout $(CONFORMANCE_FLAGS)

image: build
	bash hack/image.sh

clean:
	rm -rf _output
