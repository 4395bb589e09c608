package loopfs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// ThreadsWaiting counts the threads of process pid in uninterruptible
// sleep (state D): how a test that froze its file system (fsfreeze) sees a
// write wait on it.
func ThreadsWaiting(pid int) (int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("threads of %d: %w", pid, err)
	}
	n := 0
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && bytes.HasPrefix(b[i+1:], []byte(" D")) {
			n++
		}
	}
	return n, nil
}
