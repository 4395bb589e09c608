// Command rtarget is the target daemon of the rnic block service: it serves
// the volumes of a store (the thin store by default) to rinit initiators
// and NVMe/RDMA hosts over a software iWARP RNIC, and manages those
// volumes, through the running daemon or directly.
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
		Description: "rtarget keeps volumes in a store and serves them to rinit initiators, which move every byte\n" +
			"themselves with RDMA Read and Write (and, with serve --nvmf-listen, to NVMe/RDMA hosts). The default\n" +
			"store (--store thin) keeps volume data in sparse files in --data and the metadata (volumes, cluster\n" +
			"maps, snapshots) in an embedded badger database; --store memory keeps volumes in memory.\n" +
			"The volume commands work while serve runs (through its control socket) and when it does not.\n\n" +
			"Every flag can also be set with an environment variable (RTARGET_<FLAG>) or a config file (--config).",
		HideHelpCommand: true,
		Commands:        []*cli.Command{serveCommand(), volumeCommand()},
	})
}
