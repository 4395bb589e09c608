//go:build !linux

package childproc

import "syscall"

func setParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
