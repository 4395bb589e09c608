package initiator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/rnic-dev/rnic/blockproto"
)

// TestStartAsyncOnDeadQP: a request started by startAsync on a QP that
// died (its session not failed yet: stop waits for the engine first) finds
// the QP dead in start, which hands the slot back to the free list. From
// then on the slot is another request's: startAsync must not touch it
// any more, or its clean-up of the slot's fields (the caller's buffer,
// the async request) lands on the request that took the slot next. Two
// goroutines start requests on the one slot of such a QP while its
// handler is held in a Completion (so the QP cannot stop and fail the
// session meanwhile); the race detector reports a clean-up after the
// hand-back.
func TestStartAsyncOnDeadQP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, s, q := oneSlotClient(t, ctx)

	// Hold the QP's handler in a Completion, then kill the QP.
	entered, release := make(chan struct{}), make(chan struct{})
	buf := make([]byte, 4096)
	c.StartRead(ctx, buf, 0, CompletionFunc(func(err error) {
		close(entered)
		<-release
	}))
	<-entered
	q.die(fmt.Errorf("%w: test: QP killed", errConnLost))
	if c.live() != s {
		close(release)
		t.Fatal("the session failed while its QP's handler was held")
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	started := 0
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 4096)
			for range 200 {
				a := asyncReq{c: c, ctx: ctx, op: blockproto.OpRead, p: p, cpl: CompletionFunc(func(error) {})}
				if c.startAsync(&a) {
					mu.Lock()
					started++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(release)
	if started != 0 {
		t.Fatalf("%d requests started on a dead QP", started)
	}
	if !q.idle() {
		t.Fatalf("the dead QP's slot is not free: %d of %d", len(q.free), len(q.slots))
	}
}

// TestStartAsyncSlotKeptWhileStarting: a request's QP dies while start
// is between making the exchange visible and checking the QP, and stop
// fails the exchange at once. Its completion frees the slot, and another
// request may take it; start, still running, reads the slot's fields and,
// on a dead QP, hands the slot back a second time over that request. The
// slot must stay the starting request's until start returns: the
// completion runs then, and the request still gets its answer.
func TestStartAsyncSlotKeptWhileStarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, q := oneSlotClient(t, ctx)

	var once sync.Once
	freeWhileStarting := false
	q.startHook = func() {
		once.Do(func() {
			q.die(fmt.Errorf("%w: test: QP killed", errConnLost))
			<-q.stopped // the exchange was failed
			select {
			case i := <-q.free:
				freeWhileStarting = true
				q.free <- i
			default:
			}
		})
	}
	done := make(chan error, 1)
	c.StartRead(ctx, make([]byte, 4096), 0, CompletionFunc(func(err error) { done <- err }))
	if freeWhileStarting {
		t.Error("the slot was free for another request while start still used it")
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("a read on a QP that died (no reconnect) succeeded")
		}
	case <-ctx.Done():
		t.Fatal("the request was never completed")
	}
	if len(q.free) != len(q.slots) {
		t.Fatalf("%d of %d slots free after the request completed", len(q.free), len(q.slots))
	}
}

// oneSlotClient connects a client with one QP of one slot, which does not
// reconnect, to a new target; it is closed when the test ends.
func oneSlotClient(t *testing.T, ctx context.Context) (*Client, *session, *conn) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, secret := startTarget(t, ctx, quiet)
	c, err := Connect(ctx, Config{Addr: addr, Volume: "v", Initiator: "g", Secret: secret, Logger: quiet,
		QPs: 1, QueueDepth: 1, NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c, s, s.qps[0]
}
