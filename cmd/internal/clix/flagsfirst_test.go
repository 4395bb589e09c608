package clix

import (
	"slices"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestFlagsFirst(t *testing.T) {
	app := &cli.App{Name: "p", Commands: []*cli.Command{{Name: "volume", Subcommands: []*cli.Command{
		{Name: "create", Flags: []cli.Flag{&cli.StringFlag{Name: "data"}, &cli.StringFlag{Name: "raw"}, &cli.BoolFlag{Name: "json"}}},
	}}}}
	for _, c := range []struct{ in, want []string }{
		{[]string{"p", "volume", "create", "a", "1G", "--data", "d"}, []string{"p", "volume", "create", "--data", "d", "a", "1G"}},
		{[]string{"p", "volume", "create", "--data", "d", "a", "1G"}, []string{"p", "volume", "create", "--data", "d", "a", "1G"}},
		{[]string{"p", "volume", "create", "a", "--json", "b", "--data=d"}, []string{"p", "volume", "create", "--json", "--data=d", "a", "b"}},
		{[]string{"p", "volume", "create", "a", "--", "--data", "d"}, []string{"p", "volume", "create", "a", "--", "--data", "d"}},
		{[]string{"p", "volume", "create", "a", "--bogus", "d"}, []string{"p", "volume", "create", "a", "--bogus", "d"}},
		{[]string{"p", "other", "x", "--data", "d"}, []string{"p", "other", "x", "--data", "d"}},
	} {
		if got := FlagsFirst(app, c.in); !slices.Equal(got, c.want) {
			t.Errorf("FlagsFirst(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
