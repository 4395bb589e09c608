// Command rtarget is the target daemon of the rnic block service: it serves
// the volumes of a store (embedded badger by default) to rinit initiators
// over a software iWARP RNIC, and manages those volumes offline.
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
)

func main() {
	app := newApp()
	if err := app.Run(clix.FlagsFirst(app, os.Args)); err != nil {
		clix.Exit("rtarget", err)
	}
}

// newApp builds the command line: every command, its flags and their
// environment variables (the tests walk it).
func newApp() *cli.App {
	return clix.Setup(&cli.App{
		Name:  "rtarget",
		Usage: "serve block volumes over a software iWARP RNIC",
		Description: "rtarget keeps volumes in a store (the embedded badger database by default) and serves them to\n" +
			"rinit initiators, which move every byte themselves with RDMA Read and Write.\n\n" +
			"Every flag can also be set with an environment variable (RTARGET_<FLAG>) or a config file (--config).",
		HideHelpCommand: true,
		Commands:        []*cli.Command{serveCommand(), volumeCommand()},
	})
}
