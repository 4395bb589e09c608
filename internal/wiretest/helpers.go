package wiretest

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/rnic-dev/rnic/rnic/term"
)

// Hex decodes hex written with spaces and line breaks, as the known-answer
// vectors of the tests are.
func Hex(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		tb.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// Cause returns the Terminate cause carried by err, failing tb if err is not
// (or does not wrap) a *term.Error.
func Cause(tb testing.TB, err error) term.Cause {
	tb.Helper()
	var te *term.Error
	if !errors.As(err, &te) {
		tb.Fatalf("error %v (%T) is not a *term.Error", err, err)
	}
	return te.Cause
}

// WantCause fails tb unless err carries the cause layer/etype/code.
func WantCause(tb testing.TB, err error, layer term.Layer, etype term.EType, code term.Code) {
	tb.Helper()
	want := term.Cause{Layer: layer, EType: etype, Code: code}
	if err == nil {
		tb.Fatalf("no error, want %v", want)
	}
	if got := Cause(tb, err); got != want {
		tb.Fatalf("cause %v, want %v (%v)", got, want, err)
	}
}
