# The two commands of the README:
#   make run    a target (the thin store) and an initiator exporting it over NBD on loopback
#   make test   everything CI checks (installs the Debian packages it needs first)
SHELL := /bin/bash
GO ?= $(shell ./.ci/ensure-go)
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: all build test deps vet run ceph test-ceph

all: build

build:
	$(GO) build -o bin/ ./cmd/...

# make run: rtarget with the thin store (./rtarget-data, volume
# "demo" of 1 GiB, created on first run) and rinit exporting it over NBD on
# 127.0.0.1:10809. Ctrl-C stops both (the target drains and syncs).
RUN_VOLUME ?= demo:1G
run: build
	@RUN_VOLUME=$(RUN_VOLUME) ./.ci/demo

deps:
	@./.ci/deps

# make ceph: the gateway in front of Ceph RBD (rtarget with the rbd store,
# cgo, librbd linked dynamically) as bin/rtarget-ceph; installs Debian 12's
# Ceph 16 client packages first. The default build stays pure Go and static.
CEPH_TAGS := ceph,pacific
ceph:
	@./.ci/ceph-cluster deps client
	$(GO) build -tags $(CEPH_TAGS) -o bin/rtarget-ceph ./cmd/rtarget

# The rbd backend's tests against a single-node cluster the script starts
# and stops (part of make test).
test-ceph:
	GO=$(GO) ./.ci/ceph-test

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (gofmt -l . ; echo "gofmt: files above need formatting"; exit 1)
	$(GO) vet ./...
	# Other targets: every package and test type-checks without cgo on a
	# 64-bit ARM and a 32-bit one (the default build is pure Go).
	CGO_ENABLED=0 GOARCH=arm64 $(GO) vet ./...
	CGO_ENABLED=0 GOARCH=386 $(GO) vet ./...

# RNIC_VM=1: the interoperability tests boot a Linux VM with soft-iWARP and
# the kernel NBD client (built on first use into ~/.cache/rnic/linuxvm).
export RNIC_VM ?= 1

test: deps vet
	$(GO) test -race -timeout 40m ./...
	# The engine and the initiator again without the race detector, three
	# times: its slowdown hides timing-dependent failures (about 1.5 min).
	$(GO) test -count=3 -timeout 20m ./rnic/... ./initiator/...
	# The store and rtarget serve once without it: their raw system calls
	# (pread.go) are made only there, the race detector's build takes the
	# scheduler-visible path (about 1 min).
	$(GO) test -count=1 -timeout 20m ./store/... ./cmd/rtarget
	# The steady-state allocation test skips itself under -race (the
	# detector allocates on its own): here it runs.
	$(GO) test -count=1 -run '^TestNBDSteadyStateAllocs$$' ./cmd/rinit
	GO=$(GO) ./.ci/ceph-test
	# The exhaustive CRC32c kernel checks, without the race detector (it
	# instruments none of the assembly and slows the Go kernel tenfold).
	$(GO) test -count=1 -run '^TestKernels' ./rnic/crc32c
	# The arm64 kernel against the portable one, all of the package's
	# tests under qemu-user (about 15 s).
	CGO_ENABLED=0 GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64 ./rnic/crc32c
	FUZZTIME=$(FUZZTIME) ./.ci/fuzz

FUZZTIME ?= 10s

.PHONY: fuzz
fuzz:
	FUZZTIME=$(FUZZTIME) ./.ci/fuzz
