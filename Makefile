# The two commands of the README:
#   make run    a target (embedded badger store) and an initiator exporting it over NBD on loopback
#   make test   everything CI checks (installs the Debian packages it needs first)
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all build test deps vet run

all: build

build:
	$(GO) build -o bin/ ./cmd/...

deps:
	@./.ci/deps

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (gofmt -l . ; echo "gofmt: files above need formatting"; exit 1)
	$(GO) vet ./...

# RNIC_VM=1: the interoperability tests boot a Linux VM with soft-iWARP and
# the kernel NBD client (built on first use into ~/.cache/rnic/linuxvm).
export RNIC_VM ?= 1

test: deps vet
	$(GO) test -race -timeout 40m ./...
	FUZZTIME=$(FUZZTIME) ./.ci/fuzz

FUZZTIME ?= 10s

.PHONY: fuzz
fuzz:
	FUZZTIME=$(FUZZTIME) ./.ci/fuzz
