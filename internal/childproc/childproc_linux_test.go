package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// parentEnv makes the test binary act as the parent that starts a child
// and is then killed.
const parentEnv = "CHILDPROC_TEST_PARENT"

// TestMain runs the parent role when asked: it starts sleep(1) with
// DieWithParent, prints the child's pid, and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv(parentEnv) == "" {
		os.Exit(m.Run())
	}
	child := exec.Command("sleep", "600")
	DieWithParent(child, syscall.SIGKILL)
	if err := child.Start(); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("CHILD", child.Process.Pid)
	select {}
}

// gone reports whether pid no longer runs: it does not exist, or it is a
// zombie its new parent has not reaped yet.
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestChildDiesWithKilledParent(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), parentEnv+"=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("parent printed nothing: %v", sc.Err())
	}
	line := sc.Text()
	f, ok := strings.CutPrefix(line, "CHILD ")
	pid, err := strconv.Atoi(f)
	if !ok || err != nil {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("parent said %q", line)
	}
	// Whatever happens below, the sleep does not outlive the test.
	defer syscall.Kill(pid, syscall.SIGKILL)
	if gone(pid) {
		t.Fatalf("child %d is gone before its parent died", pid)
	}

	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	parent.Wait()
	// The kernel signals the child as the parent exits; this bound only
	// keeps a failure from hanging the test.
	deadline := time.Now().Add(30 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs 30 s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
