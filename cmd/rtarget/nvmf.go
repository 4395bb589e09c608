package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/rnic"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
	"github.com/rnic-dev/rnic/target/nvmf"
)

// The NVMe/RDMA front end of rtarget serve (package target/nvmf): every
// volume as namespace 1 of subsystem nqn.2026-11.dev.rnic:NAME, for the
// Linux kernel's nvme-rdma host.
//
// The port: NVMe/RDMA's IANA port is 4420, the native protocol's default
// too. Rather than move the native default (breaking every initiator and
// script that relies on it), both protocols can share one port: when
// --nvmf-listen names the --listen address, one listener takes every MPA
// Request and tells them apart by its private data (an NVMe/RDMA host
// always sends its 32-byte CM request, a native initiator none), so
// `nvme connect -t rdma -s 4420` and rinit reach the same rtarget on the
// same port. Another address gets a listener of its own.

func nvmfFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "nvmf-listen", Usage: "serve NVMe over Fabrics (RDMA) on this address; the --listen address shares " +
			"one port between both protocols (e.g. 127.0.0.1:4420)", EnvVars: []string{"RTARGET_NVMF_LISTEN"}},
		&cli.StringSliceFlag{Name: "nvmf-host", Usage: "allow host `VOLUME=NQN` to connect to VOLUME over NVMe/RDMA (repeatable); " +
			"a volume with no --nvmf-host admits hosts on loopback addresses only", EnvVars: []string{"RTARGET_NVMF_HOST"}},
		&cli.StringFlag{Name: "nvmf-advertise", Usage: "`HOST:PORT` the discovery log gives hosts to connect to (default: the " +
			"address the host reached)", EnvVars: []string{"RTARGET_NVMF_ADVERTISE"}},
		&cli.BoolFlag{Name: "nvmf-write-back", Usage: "acknowledge NVMe/RDMA writes before they are durable (faster with the thin " +
			"store; Flush and FUA still sync). Without it every write is durable first: a host outlives a crash of rtarget, " +
			"reconnects and replays its Flush to the restarted rtarget, which could not tell it that writes it had " +
			"acknowledged were lost", EnvVars: []string{"RTARGET_NVMF_WRITE_BACK"}},
		&cli.BoolFlag{Name: "nvmf-mpa-crc", Usage: "ask NVMe/RDMA hosts for MPA CRCs (otherwise used when the host asks: Linux " +
			"siw does not by default)", EnvVars: []string{"RTARGET_NVMF_MPA_CRC"}},
	}
}

// parseNVMFHosts reads the --nvmf-host VOLUME=NQN values.
func parseNVMFHosts(vals []string) (map[string][]string, error) {
	hosts := map[string][]string{}
	for _, v := range vals {
		vol, nqn, ok := strings.Cut(v, "=")
		if !ok || vol == "" || !nvmf.ValidNQN(nqn) {
			return nil, fmt.Errorf("--nvmf-host %q: want VOLUME=NQN, e.g. disk0=nqn.2014-08.org.nvmexpress:uuid:…", v)
		}
		hosts[vol] = append(hosts[vol], nqn)
	}
	return hosts, nil
}

// sameAddr reports whether two listen addresses are the same (host and
// port; hosts compared as IPs when they are).
func sameAddr(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	ia, ib := net.ParseIP(ha), net.ParseIP(hb)
	if ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return ha == hb
}

// startNVMF starts the NVMe/RDMA front end if --nvmf-listen is set. It
// returns the server (nil if not enabled) and what the native target takes
// its connection requests from: l itself, or l's native side when the port
// is shared.
func startNVMF(ctx context.Context, c *cli.Context, dev *rnic.Device, t *target.Target, st store.Store, l *rnic.Listener,
	log *slog.Logger) (*nvmf.Server, target.Acceptor, error) {
	addr := c.String("nvmf-listen")
	if addr == "" {
		return nil, l, nil
	}
	hosts, err := parseNVMFHosts(c.StringSlice("nvmf-host"))
	if err != nil {
		return nil, nil, err
	}
	if adv := c.String("nvmf-advertise"); adv != "" {
		if _, _, err := net.SplitHostPort(adv); err != nil {
			return nil, nil, fmt.Errorf("--nvmf-advertise %q: %w", adv, err)
		}
	}
	srv, err := nvmf.New(nvmf.Config{Target: t, Store: st, Device: dev, Logger: log, Hosts: hosts,
		Advertise: c.String("nvmf-advertise"), CRC: c.Bool("nvmf-mpa-crc"), WriteBack: c.Bool("nvmf-write-back")})
	if err != nil {
		return nil, nil, err
	}
	if len(hosts) == 0 && !clix.IsLoopback(addr) {
		log.Warn("NVMe/RDMA on a non-loopback address with no --nvmf-host: only hosts on loopback addresses are admitted",
			"nvmf_listen", addr)
	}
	var vols []string
	for v := range hosts {
		vols = append(vols, v)
	}
	sort.Strings(vols)
	for _, v := range vols {
		log.Info("NVMe/RDMA allow-list", "volume", v, "nqn", nvmf.SubsystemNQN("", v), "hosts", strings.Join(hosts[v], ","))
	}
	log.Warn("NVMe/RDMA has no in-band authentication here (DH-HMAC-CHAP is not implemented): a host NQN on an allow-list " +
		"is a claim, not a proof")
	if sameAddr(addr, c.String("listen")) {
		log.Info("NVMe/RDMA shares the native listener", "listen", l.Addr().String())
		return srv, nvmf.Share(l, srv), nil
	}
	nl, err := dev.Listen(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--nvmf-listen: %w", err)
	}
	go func() {
		<-ctx.Done()
		nl.Close()
	}()
	go func() {
		if err := srv.Serve(ctx, nl); err != nil && ctx.Err() == nil {
			log.Error("NVMe/RDMA listener stopped", "err", err)
		}
	}()
	log.Info("NVMe/RDMA listening", "nvmf_listen", nl.Addr().String())
	return srv, l, nil
}
