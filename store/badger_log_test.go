package store

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestSlogBadgerLevels(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := slogBadger{log: log, min: slog.LevelWarn}
	l.Debugf("debug %d", 1)
	l.Infof("info %d", 2)
	l.Warningf("warn %d\n", 3)
	l.Errorf("error %d", 4)
	out := buf.String()
	if strings.Contains(out, "debug 1") || strings.Contains(out, "info 2") {
		t.Fatalf("messages below the minimum level forwarded:\n%s", out)
	}
	if !strings.Contains(out, `level=WARN msg="warn 3"`) || !strings.Contains(out, `level=ERROR msg="error 4"`) {
		t.Fatalf("warn/error not forwarded as such:\n%s", out)
	}
}

// TestBadgerLogsThroughSlog opens a store with a Logger at Info and sees
// badger's start-up messages arrive tagged component=badger.
func TestBadgerLogsThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	s, err := OpenThin(t.TempDir(), ThinOptions{Logger: log, LogLevel: slog.LevelInfo})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "level=INFO") || !strings.Contains(buf.String(), "component=badger") {
		t.Fatalf("no badger messages through slog:\n%s", buf.String())
	}
}
