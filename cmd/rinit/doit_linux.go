package main

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// nbdDoItIoctl makes the NBD_DO_IT ioctl, which blocks until the device is
// disconnected, on a thread of its own with every signal blocked. The
// kernel (6.1, nbd_start_device_ioctl) waits interruptibly: a signal
// delivered to the waiting thread shuts the device's sockets down, and Go's
// handlers are installed with SA_RESTART, so the ioctl is then restarted,
// finds the device started (nbd->pid) and fails with EBUSY, the device
// dead. Any signal will do, and Go's runtime signals its own threads
// (SIGURG, to preempt goroutines). In CI rinit attach once failed with
// EBUSY from NBD_DO_IT 67 ms after logging in, which this explains.
//
// The thread is not unlocked: it ends with the calling goroutine, and its
// signal mask with it. Call it in a goroutine of its own.
func nbdDoItIoctl(f *os.File) error {
	runtime.LockOSThread()
	var all unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^all.Val[i]
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &all, nil); err != nil {
		return fmt.Errorf("blocking signals for NBD_DO_IT: %w", err)
	}
	return nbdIoctl(f, nbdDoIt, 0)
}
