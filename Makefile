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
# The build's identity (pkg/version): the VERSION file and the commit
# ("-dirty" when tracked files differ from it), stamped by the linker. No
# time is stamped and paths are trimmed, so two builds of one tree are the
# same bytes. With -trimpath Go does not record -ldflags in the binary's
# build information; `go version -m` shows the commit (vcs.revision, from
# git) and, for a build of a tagged commit, the tag as the module's version.
VERSION ?= $(shell cat VERSION)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git rev-parse HEAD >/dev/null 2>&1 && { git diff --quiet HEAD -- || echo -dirty; })
VERSION_PKG := github.com/nftpolicy/nftpolicy/pkg/version
GO_LDFLAGS := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT)
GO_BUILDFLAGS := -trimpath -buildvcs=auto -ldflags "$(GO_LDFLAGS)"

.PHONY: all build plugin-cross test test-unit fuzz redteam vet lint tools deps demo bench bench-quick diff diff-long conformance conformance-npa rollout conformance-helm image clean compare release release-verify release-check helm chart-test promtool monitoring-test

all: build

build:
	$(GO) build $(GO_BUILDFLAGS) -o $(BIN) ./cmd/nftpolicy
	# The kubectl plugin: kubectl runs kubectl-nftpolicy on PATH. Its own
	# binary, without the kernel side (cmd/kubectl-nftpolicy).
	rm -f $(PLUGIN)
	$(GO) build $(GO_BUILDFLAGS) -o $(PLUGIN) ./cmd/kubectl-nftpolicy

# The plugin builds for the operators' machines: macOS and Windows too.
plugin-cross:
	GOOS=darwin GOARCH=arm64 $(GO) build $(GO_BUILDFLAGS) -o $(dir $(BIN))darwin-arm64/kubectl-nftpolicy ./cmd/kubectl-nftpolicy
	GOOS=windows GOARCH=amd64 $(GO) build $(GO_BUILDFLAGS) -o $(dir $(BIN))windows-amd64/kubectl-nftpolicy.exe ./cmd/kubectl-nftpolicy

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
# one target at a time), by hack/fuzz.sh: it prints how many inputs each
# target executed (fuzz_new_execs_<Target>=N) and fails when one executed
# none of its own. Inputs that found a bug are kept under each package's
# testdata/fuzz/<FuzzName>/ and replayed by plain `go test`.
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash hack/fuzz.sh

# The red-team suite alone (tests/redteam, docs/security.md): every attack
# on the agent enacted on the real kernel; make test runs it too.
redteam: deps tools build
	NFTPOLICY_REQUIRE_TOOLS=1 NFTPOLICY_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v ./tests/redteam

# Everything: lint, unit, real-kernel (root, network namespaces), real API
# server, end-to-end, and the differential check over a fixed seed range.
test: deps tools helm promtool lint build plugin-cross
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

# The release's chart with the real helm: install, upgrade to the next
# release and rollback under connections, uninstall, cleanup.yaml (two
# nodes, queue mode; hack/conformance/README.md). About 1.5 minutes once the
# two releases are built.
conformance-helm: deps build
	bash hack/conformance.sh --suite helm $(CONFORMANCE_FLAGS)

image: build
	bash hack/image.sh

# Every artifact of a release in _output/release/<VERSION>/ (hack/release.sh:
# the multi-arch agent image as an OCI image index, install.yaml pinned by
# digest, the kubectl plugin and its krew manifest, SBOMs, SHA256SUMS).
release:
	bash hack/release.sh

# Two builds of the release must be identical; then release-check.
release-verify:
	bash hack/release-verify.sh

# The release's binaries, image index and manifest (hack/release-check.sh).
release-check:
	bash hack/release-check.sh

# The real helm, built from the Go module proxy (hack/helm.sh).
helm:
	bash hack/helm.sh

# charts/nftpolicy: helm template with default values renders install.yaml's
# objects, values, helm lint (tests/chart).
chart-test: helm
	NFTPOLICY_REQUIRE_TOOLS=1 $(GO) test -count=1 ./tests/chart

# The real promtool, built from the Go module proxy (hack/promtool.sh).
promtool:
	bash hack/promtool.sh

# deploy/monitoring: promtool check rules and test rules of the alerts, the
# PrometheusRule, ServiceMonitor and runbook, and every metric the alerts
# and the dashboard use scraped from real agents in the lab
# (tests/monitoring; make test runs it too).
monitoring-test: deps tools promtool build
	NFTPOLICY_REQUIRE_TOOLS=1 NFTPOLICY_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 ./tests/monitoring

clean:
	rm -rf _output
