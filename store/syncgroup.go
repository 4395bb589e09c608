package store

import (
	"context"
	"sync"
)

// syncGroup shares one expensive sync among concurrent callers. A caller is
// served by a sync that starts after it called: if none is running it runs
// one itself; if one is running it joins (or leads) the single sync queued
// behind it. N concurrent callers therefore cause at most two syncs.
type syncGroup struct {
	fn func() error

	mu      sync.Mutex
	running *syncRound // sync in progress, or nil
	pending *syncRound // sync to start when running ends, or nil
	joined  int        // callers that joined a pending round (for tests)
}

type syncRound struct {
	done chan struct{}
	err  error
}

func newSyncGroup(fn func() error) *syncGroup { return &syncGroup{fn: fn} }

// Sync returns once a sync that started after the call has finished, with
// its result. Only a caller waiting on a sync it does not run gives up when
// ctx ends.
func (g *syncGroup) Sync(ctx context.Context) error {
	g.mu.Lock()
	if r := g.pending; r != nil {
		g.joined++
		g.mu.Unlock()
		select {
		case <-r.done:
			return r.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r := &syncRound{done: make(chan struct{})}
	if prev := g.running; prev != nil {
		// Lead the round behind prev: prev's end makes r the running one.
		g.pending = r
		g.mu.Unlock()
		<-prev.done
	} else {
		g.running = r
		g.mu.Unlock()
	}
	r.err = g.fn()
	g.mu.Lock()
	g.running, g.pending = g.pending, nil
	g.mu.Unlock()
	close(r.done)
	return r.err
}
