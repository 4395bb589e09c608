package main

import (
	"errors"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/store"
)

func init() {
	registerStore(storeKind{
		name:  "memory",
		usage: "volumes in the memory of rtarget serve, lost on exit (for tests and benchmarks; serve only)",
		// The volumes live in the memory of rtarget serve, which has no
		// control socket for them: a volume command would only see an
		// empty store of its own, lost when it exits.
		open: func(_ *cli.Context, _ *slog.Logger, serving bool) (store.Store, error) {
			if !serving {
				return nil, errors.New("--store memory: the volumes live inside rtarget serve only " +
					"(give them with its --volume flags); the volume commands cannot reach them")
			}
			return store.NewMemory(), nil
		},
		control: func(*cli.Context) string { return "" },
	})
}
