// Package childproc holds what the project's test harnesses and benchmark
// runners do to the daemons they start, so that none of them outlives the
// program that started it.
package childproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent arranges for cmd, once started, to receive sig when the
// process that started it dies, even by SIGKILL: a test binary killed by
// its timeout or by hand then leaves no rtarget, rinit, nbdkit or QEMU
// running. It keeps what cmd.SysProcAttr already holds. Call it before
// cmd.Start.
//
// On Linux this is PR_SET_PDEATHSIG, which the kernel ties to the thread
// that forked, not to the process: the signal also comes if that thread
// exits while the process lives on. A Go program's threads end only with a
// goroutine that called runtime.LockOSThread and returned without
// unlocking; a program that does so must not start children here from
// such a goroutine. The setting survives exec, so a child that execs
// another program (run-vm.sh execs timeout(1)) passes it on; timeout(1)
// forwards a SIGTERM to the command it watches. Elsewhere it does nothing.
func DieWithParent(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	setParentDeathSignal(cmd.SysProcAttr, sig)
}
