package initiator_test

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestDialJoinFails: the session's first QP logs in, the second one's
// connection is dropped at once. Connect must fail (and a reconnect loop
// go on) instead of hanging on the first QP, whose poller never started.
func TestDialJoinFails(t *testing.T) {
	e := newEnv(t, envOpts{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	target := e.addr
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if n%2 == 1 { // every session's second QP
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				io.Copy(c, u)
			}()
		}
	}()
	e.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() {
		c, err := e.dial("halfway", nil)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Connect succeeded with the second QP's connection dropped")
		}
		t.Logf("Connect: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Connect hangs when the session's second QP cannot log in")
	}
}
