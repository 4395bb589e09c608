package main

import (
	"reflect"
	"testing"
)

func TestParseNVMFHosts(t *testing.T) {
	got, err := parseNVMFHosts([]string{"a=nqn.2014-08.org.nvmexpress:uuid:1", "b=nqn.2000-01.com.example:h", "a=nqn.x.y:z"})
	want := map[string][]string{"a": {"nqn.2014-08.org.nvmexpress:uuid:1", "nqn.x.y:z"}, "b": {"nqn.2000-01.com.example:h"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"a", "=nqn.x:y", "a=host1", "a=", "a=nqn."} {
		if _, err := parseNVMFHosts([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSameAddr(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"127.0.0.1:4420", "127.0.0.1:4420", true},
		{"[::1]:4420", "[0:0:0:0:0:0:0:1]:4420", true},
		{"127.0.0.1:4420", "127.0.0.1:4421", false},
		{"0.0.0.0:4420", "127.0.0.1:4420", false},
		{"localhost:4420", "localhost:4420", true},
		{"bad", "bad", false},
	} {
		if got := sameAddr(c.a, c.b); got != c.same {
			t.Errorf("sameAddr(%q, %q) = %v", c.a, c.b, got)
		}
	}
}
