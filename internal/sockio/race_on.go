//go:build race

package sockio

// raceWrite tells the race detector that p was written, as the kernel did
// in a read it cannot see.
func raceWrite(p []byte) { copy(p, p) }

const raceEnabled = true
