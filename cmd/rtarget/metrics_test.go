package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
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
