// Package rbdtest holds the tests of the rbd store (store.OpenRBD) against
// a real Ceph cluster: the store conformance suite, taking a volume over
// from another target (fencing), and what a crash may tear. They need the
// build tags ceph and pacific (make test-ceph runs them).
package rbdtest
