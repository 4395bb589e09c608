package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// slogBadger adapts a *slog.Logger to badger's Logger interface. Messages
// below min are dropped before they are formatted.
type slogBadger struct {
	log *slog.Logger
	min slog.Leveler
}

func (l slogBadger) emit(level slog.Level, format string, args []any) {
	// badger's cache statistics come as warnings; they are advice on
	// tuning, not trouble.
	if level == slog.LevelWarn && (strings.HasPrefix(format, "%s might be too small") ||
		strings.HasPrefix(format, "Cache life expectancy")) {
		level = slog.LevelDebug
	}
	if level < l.min.Level() || !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, strings.TrimRight(fmt.Sprintf(format, args...), "\n"))
}

func (l slogBadger) Errorf(f string, a ...any)   { l.emit(slog.LevelError, f, a) }
func (l slogBadger) Warningf(f string, a ...any) { l.emit(slog.LevelWarn, f, a) }
func (l slogBadger) Infof(f string, a ...any)    { l.emit(slog.LevelInfo, f, a) }
func (l slogBadger) Debugf(f string, a ...any)   { l.emit(slog.LevelDebug, f, a) }
