package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rnic-dev/rnic/internal/loopfs"
	"github.com/rnic-dev/rnic/store"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeMetricsReportsFailure: a metrics server whose listener breaks
// logs an error saying metrics are no longer served; one stopped on
// purpose logs nothing.
func TestServeMetricsReportsFailure(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	for _, broken := range []bool{false, true} {
		var logs syncBuffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stop, done := serveMetrics(ln, h, log)
		resp, err := http.Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if broken {
			ln.Close() // the listener fails under the server
		} else {
			stop()
		}
		<-done
		stop()
		got := logs.String()
		if broken != strings.Contains(got, "level=ERROR msg=\"metrics server stopped") {
			t.Fatalf("listener broken %v, logged %q", broken, got)
		}
	}
}

// TestHealthzAfterFailedSync: /healthz answers 503 with the cause once the
// store, or a raw volume of it, refuses writes after a failed sync (a flush
// of a write the file system lost, cut as by a power failure), 200 before:
// a thin store on the file system cut, and a raw volume's file on it with
// the store elsewhere.
func TestHealthzAfterFailedSync(t *testing.T) {
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "thin", true: "raw"}[raw], func(t *testing.T) {
			fs := loopfs.Ext4FS(t, 256<<20)
			ctx := context.Background()
			dir, opts := filepath.Join(fs.Dir, "data"), store.CreateOptions{}
			if raw {
				dir, opts.Raw = t.TempDir(), filepath.Join(fs.Dir, "raw.img")
				if err := os.WriteFile(opts.Raw, make([]byte, 1<<20), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			st, err := store.OpenThin(dir, store.ThinOptions{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close() // an error for the thin store: its database cannot close
			if _, err := st.CreateVolume(ctx, "v", 1<<20, opts); err != nil {
				t.Fatal(err)
			}
			v, err := st.OpenVolume(ctx, "v")
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			h := metricsHandler(nil, nil, st, slog.New(slog.DiscardHandler))
			healthz := func() (int, string) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
				return rec.Code, rec.Body.String()
			}
			block := make([]byte, store.BlockSize)
			if err := v.WriteBlocks(ctx, 0, block, true); err != nil {
				t.Fatal(err)
			}
			if code, body := healthz(); code != http.StatusOK {
				t.Fatalf("/healthz of a healthy store: %d %s", code, body)
			}
			if err := v.WriteBlocks(ctx, 1, block, false); err != nil { // in the page cache
				t.Fatal(err)
			}
			if err := fs.PowerCut(); err != nil {
				t.Fatal(err)
			}
			if err := v.Flush(ctx); err == nil {
				t.Fatal("a flush on a dead file system succeeded")
			}
			if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "input/output error") {
				t.Errorf("/healthz after a failed sync: %d %q, want 503 with the cause", code, body)
			}
		})
	}
}
