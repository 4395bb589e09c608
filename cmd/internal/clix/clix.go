// Package clix holds what rtarget and rinit share on the command line:
// sizes like 512M, the config file, logging flags and the pre-shared secret.
//
// Config file format: one "key = value" per line, where key is a long flag
// name of the command (without dashes; with LoadSharedConfig, of any
// command of the program, each command taking its own); '#' starts a
// comment; a repeatable
// flag may appear on several lines. Values may be quoted with double
// quotes. Precedence, highest first: command-line flag, environment
// variable, config file, default.
package clix

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// ParseSize parses a byte count: a number with an optional K, M, G, T or P
// suffix (powers of 1024, an optional trailing "B" or "iB" is accepted).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		case 'P':
			mult = 1 << 50
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("invalid size %q (want a positive number with an optional K, M, G, T or P suffix, e.g. 512M)", s)
	}
	if v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * mult, nil
}

// FormatSize renders n bytes in the largest unit that divides it exactly,
// or with one decimal otherwise.
func FormatSize(n int64) string {
	units := []string{"", "K", "M", "G", "T", "P"}
	for i := len(units) - 1; i > 0; i-- {
		u := int64(1) << (10 * i)
		if n >= u {
			if n%u == 0 {
				return fmt.Sprintf("%d%s", n/u, units[i])
			}
			return fmt.Sprintf("%.1f%s", float64(n)/float64(u), units[i])
		}
	}
	return fmt.Sprintf("%dB", n)
}

// ConfigFlag is the --config flag.
func ConfigFlag(envPrefix string) cli.Flag {
	return &cli.StringFlag{Name: "config", Usage: "read flags from `FILE` (key = value lines, keys are flag names)",
		EnvVars: []string{envPrefix + "CONFIG"}}
}

// LoadConfig sets, from the file named by --config, every flag the command
// line and the environment left unset. Unknown keys are errors.
func LoadConfig(c *cli.Context) error { return loadConfig(c, false) }

// LoadSharedConfig is LoadConfig for a program whose commands share one
// config file (rtarget's serve and volume commands): a key that is a flag
// of another of its commands is passed over, so that each command reads the
// settings it knows of a file written for another; a key that no command
// of the program has is still an error, so that a typo does not pass
// silently.
func LoadSharedConfig(c *cli.Context) error { return loadConfig(c, true) }

// loadConfig is LoadConfig, and with shared LoadSharedConfig.
func loadConfig(c *cli.Context, shared bool) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	kv, err := ParseConfig(f)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	known := flagNames(c.Command.Flags)
	var elsewhere map[string]bool // the flags of the program's other commands
	if shared {
		elsewhere = flagNames(c.App.Flags)
		var walk func([]*cli.Command)
		walk = func(cmds []*cli.Command) {
			for _, cmd := range cmds {
				maps.Copy(elsewhere, flagNames(cmd.Flags))
				walk(cmd.Subcommands)
			}
		}
		walk(c.App.Commands)
	}
	// Decide first which keys the command line or the environment set:
	// those win, and a repeatable key may then take several lines.
	external := map[string]bool{}
	for _, e := range kv {
		switch {
		case known[e.Key]:
			external[e.Key] = c.IsSet(e.Key)
		case elsewhere[e.Key]:
		case shared:
			return fmt.Errorf("config %s:%d: unknown setting %q: no %s command has such a flag", path, e.Line, e.Key, c.App.Name)
		default:
			return fmt.Errorf("config %s:%d: unknown setting %q for %s", path, e.Line, e.Key, c.Command.FullName())
		}
	}
	for _, e := range kv {
		if external[e.Key] || !known[e.Key] {
			continue
		}
		if err := c.Set(e.Key, e.Value); err != nil {
			return fmt.Errorf("config %s:%d: %s: %w", path, e.Line, e.Key, err)
		}
	}
	return nil
}

// flagNames returns the names (and aliases) of flags.
func flagNames(flags []cli.Flag) map[string]bool {
	names := map[string]bool{}
	for _, fl := range flags {
		for _, n := range fl.Names() {
			names[n] = true
		}
	}
	return names
}

// Entry is one config file setting.
type Entry struct {
	Key, Value string
	Line       int
}

// ParseConfig reads "key = value" lines.
func ParseConfig(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: want key = value", n)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if strings.HasPrefix(v, `"`) {
			u, err := strconv.Unquote(v)
			if err != nil {
				return nil, fmt.Errorf("line %d: bad quoted value: %w", n, err)
			}
			v = u
		} else if i := strings.Index(v, " #"); i >= 0 {
			v = strings.TrimSpace(v[:i])
		}
		out = append(out, Entry{Key: k, Value: v, Line: n})
	}
	return out, sc.Err()
}

// LogFlags are --log-format and --log-level.
func LogFlags(envPrefix string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json", EnvVars: []string{envPrefix + "LOG_FORMAT"}},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn or error", EnvVars: []string{envPrefix + "LOG_LEVEL"}},
	}
}

// Logger builds the logger the log flags ask for, writing to w.
func Logger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.String("log-format"))
}

// InsecureSecret is the secret both sides use when none is configured. It
// is public: the login exchange then proves nothing, which is why rtarget
// accepts it only on loopback listeners unless --insecure is given.
const InsecureSecret = "rnic-insecure-no-secret-configured"

// ReadSecret reads a secret file (surrounding whitespace is trimmed). An
// empty path gives the insecure default.
func ReadSecret(path string) ([]byte, bool, error) {
	if path == "" {
		return []byte(InsecureSecret), false, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("secret file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil, false, fmt.Errorf("secret file %s is empty", path)
	}
	return []byte(s), true, nil
}

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Exit statuses: ExitError for a failure, ExitUsage for a mistake on the
// command line (the status Go's flag package and most Unix tools use).
const (
	ExitError = 1
	ExitUsage = 2
)

// Exit prints err as one line and exits: a UsageError as it is (it names
// the command) with ExitUsage, anything else prefixed by the program name
// with ExitError.
func Exit(prog string, err error) {
	var ee cli.ExitCoder
	if errors.As(err, &ee) && ee.ExitCode() == 0 {
		return
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		fmt.Fprintln(os.Stderr, ue.Error())
		os.Exit(ExitUsage)
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
	os.Exit(ExitError)
}

// UsageError is a mistake on the command line: an unknown flag or command,
// a flag without its value, a value (or environment variable) that does not
// parse. Its message is one line naming the command and where its help is.
type UsageError struct {
	Command string // e.g. "rtarget serve"
	Err     error
}

func (e *UsageError) Error() string {
	return fmt.Sprintf("%s: %v (see %s --help)", e.Command, e.Err, e.Command)
}

func (e *UsageError) Unwrap() error { return e.Err }

// commandName is the full name of the command c runs, e.g. "rtarget volume
// import" (cli.Command.FullName gives only the last word).
func commandName(c *cli.Context) string {
	if c.Command != nil && c.Command.HelpName != "" {
		return c.Command.HelpName
	}
	return c.App.HelpName
}

// onUsageError replaces urfave/cli's "Incorrect Usage" message followed by
// the whole help with a one-line UsageError.
func onUsageError(c *cli.Context, err error, _ bool) error {
	return &UsageError{Command: commandName(c), Err: err}
}

// groupAction is the action of the app and of the commands that only hold
// subcommands: without arguments it shows the help, as urfave/cli does; an
// argument that names no subcommand is a UsageError (urfave/cli would say
// "No help topic for ..." and exit 3).
func groupAction(root bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.Args().Present() {
			return &UsageError{Command: commandName(c), Err: fmt.Errorf("unknown command %q", c.Args().First())}
		}
		if root {
			return cli.ShowAppHelp(c)
		}
		return cli.ShowSubcommandHelp(c)
	}
}

// Setup makes every command of app report usage errors as one-line
// UsageErrors (see Exit) instead of printing its help, and returns app.
func Setup(app *cli.App) *cli.App {
	app.OnUsageError = onUsageError
	if app.Action == nil {
		app.Action = groupAction(true)
	}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			cmd.OnUsageError = onUsageError
			if len(cmd.Subcommands) > 0 && cmd.Action == nil {
				cmd.Action = groupAction(false)
			}
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}

// CheckEnvVars lists the flags of app and of all its commands that break
// the rule "every flag can also be set by an environment variable starting
// with envPrefix": flags without a variable, variables without the prefix,
// and a variable used by two flags of one command (help and version are
// urfave/cli's own and exempt). Tests call it on each program's app.
func CheckEnvVars(app *cli.App, envPrefix string) []string {
	var bad []string
	check := func(path string, flags []cli.Flag) {
		seen := map[string]string{}
		for _, f := range flags {
			name := f.Names()[0]
			if name == "help" || name == "version" {
				continue
			}
			flag := path + " --" + name
			if len(name) == 1 {
				flag = path + " -" + name
			}
			df, ok := f.(cli.DocGenerationFlag)
			if !ok || len(df.GetEnvVars()) == 0 {
				bad = append(bad, flag+": no environment variable")
				continue
			}
			for _, e := range df.GetEnvVars() {
				if !strings.HasPrefix(e, envPrefix) {
					bad = append(bad, flag+": variable "+e+" lacks the prefix "+envPrefix)
				}
				if other, dup := seen[e]; dup {
					bad = append(bad, flag+": variable "+e+" also sets "+other)
				}
				seen[e] = name
			}
		}
	}
	check(app.Name, app.Flags)
	var walk func(string, []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			p := path + " " + cmd.Name
			check(p, cmd.Flags)
			walk(p, cmd.Subcommands)
		}
	}
	walk(app.Name, app.Commands)
	return bad
}

// CPUsFlag is --cpus: how many CPUs may run the program's Go code at once
// (GOMAXPROCS).
func CPUsFlag(envPrefix string) cli.Flag {
	return &cli.IntFlag{Name: "cpus", Value: 0, EnvVars: []string{envPrefix + "CPUS"},
		Usage: "run on at most `N` CPUs at once (GOMAXPROCS; 0: all): a cap leaves the other CPUs to other work " +
			"(the application, fio, a co-located target)"}
}

// ApplyCPUs applies --cpus.
func ApplyCPUs(c *cli.Context) error {
	n := c.Int("cpus")
	if n < 0 {
		return fmt.Errorf("--cpus %d: want 0 (all) or a positive number", n)
	}
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return nil
}

// AddPprof serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/ on mux: CPU, heap, goroutines, blocking. They show the
// program's internals, so they are only on listeners the operator opened
// for it (rtarget --metrics-listen, rinit --debug-listen).
func AddPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", httppprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
}

// ProfileFlag is --cpu-profile: write a CPU profile of the whole run to a
// file (bench/ uses it; go tool pprof reads it).
func ProfileFlag(envPrefix string) cli.Flag {
	return &cli.StringFlag{Name: "cpu-profile", Usage: "write a CPU profile (pprof) of the run to `FILE`", EnvVars: []string{envPrefix + "CPU_PROFILE"}}
}

// StartProfile starts the CPU profile --cpu-profile asks for; the returned
// function stops it and closes the file.
func StartProfile(c *cli.Context) (stop func(), err error) {
	path := c.String("cpu-profile")
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// FlagsFirst returns args (a whole command line, program name first) with
// the flags that follow the positional arguments of the command they name
// moved before them, so "rtarget volume create NAME SIZE --data DIR" parses
// as "rtarget volume create --data DIR NAME SIZE" (urfave/cli stops at the
// first argument that is not a flag). A flag's value moves with it unless
// the flag is a boolean; "--" ends the reordering.
func FlagsFirst(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	cmds, flags := app.Commands, app.Flags
	i := 1
	// Find the command: leading words that name subcommands.
	for i < len(args) {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			break
		}
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(a) {
				next = c
			}
		}
		if next == nil {
			break
		}
		out = append(out, a)
		cmds, flags = next.Subcommands, next.Flags
		i++
	}
	isBool := func(name string) (known, boolean bool) {
		name = strings.TrimLeft(name, "-")
		name, _, _ = strings.Cut(name, "=")
		for _, f := range flags {
			for _, n := range f.Names() {
				if n == name {
					_, ok := f.(*cli.BoolFlag)
					return true, ok
				}
			}
		}
		return false, false
	}
	var moved, positional []string
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i:]...)
			break
		}
		known, boolean := isBool(a)
		if !strings.HasPrefix(a, "-") || a == "-" || !known {
			positional = append(positional, a)
			continue
		}
		moved = append(moved, a)
		if !boolean && !strings.Contains(a, "=") && i+1 < len(args) {
			i++
			moved = append(moved, args[i])
		}
	}
	return append(append(out, moved...), positional...)
}
