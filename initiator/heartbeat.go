package initiator

import (
	"context"
	"fmt"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
	"github.com/rnic-dev/rnic/rnic"
)

// heartbeat probes the target every interval with a Fetch-and-Add of 0 on
// the reservation word: the target's RNIC answers it by itself, so a
// target whose store is slow still answers, while one that is stopped
// (SIGSTOP), hung or cut off does not. When a probe is not answered within
// timeout the session fails, and the client reconnects (to the next
// target when there are several). It returns when the session dies.
func (s *session) heartbeat(interval, timeout time.Duration) {
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-s.dead:
			return
		case <-t.C:
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.atomic(context.Background(), rnic.WRFetchAdd, blockproto.WordOffset(blockproto.WordReservation), 0, 0)
			done <- err
		}()
		expire := time.NewTimer(timeout)
		select {
		case err := <-done:
			expire.Stop()
			if err != nil {
				return // the QP died: the session is failing already
			}
		case <-expire.C:
			s.fail(fmt.Errorf("%w: target %s answered no heartbeat within %v", ErrTimeout, s.addr, timeout))
			return
		case <-s.dead:
			expire.Stop()
			return
		}
		t.Reset(interval)
	}
}
