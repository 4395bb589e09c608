//go:build race

package store_test

// modelSteps is the length of the model tests: shorter under the race
// detector, which slows them tenfold.
const modelSteps = 120

// raceEnabled reports whether the race detector is on (it allocates).
const raceEnabled = true
