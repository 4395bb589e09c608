package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target"
	"github.com/rnic-dev/rnic/target/nvmf"
)

// serveMetrics serves h over HTTP on ln until stop is called. A server that
// fails (its listener breaks) is logged as an error: the target goes on
// serving storage without its metrics. done is closed when the server has
// returned.
func serveMetrics(ln net.Listener, h http.Handler, log *slog.Logger) (stop func(), done <-chan struct{}) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped: /metrics and /healthz are no longer served",
				"addr", ln.Addr().String(), "err", err)
		}
	}()
	return func() { srv.Close() }, ch
}

// metricsHandler serves /metrics (Prometheus text exposition format 0.0.4)
// and /healthz.
func metricsHandler(t *target.Target, nsrv *nvmf.Server, st store.Store, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if _, err := st.ListVolumes(ctx); err != nil {
			http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if h, ok := st.(store.HealthChecker); ok {
			if err := h.Health(); err != nil { // a failed sync, or a file system that cannot write
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		bw := bufio.NewWriter(w)
		writeMetrics(bw, t.Metrics())
		if nsrv != nil {
			writeNVMFMetrics(bw, nsrv.Metrics())
		}
		if sy, ok := st.(store.Syncer); ok {
			fmt.Fprintf(bw, "# HELP rtarget_store_syncs_total Syncs of the store to stable storage (flush, FUA).\n"+
				"# TYPE rtarget_store_syncs_total counter\nrtarget_store_syncs_total %d\n", sy.Syncs())
		}
		if err := bw.Flush(); err != nil {
			log.Debug("metrics write", "err", err)
		}
	})
	clix.AddPprof(mux)
	return mux
}

// writers returns functions writing one gauge or counter to w.
func writers(w *bufio.Writer) (gauge func(name, help string, v int64), counter func(name, help string, v uint64)) {
	gauge = func(name, help string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter = func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	return gauge, counter
}

func writeMetrics(w *bufio.Writer, m *target.Metrics) {
	gauge, counter := writers(w)
	gauge("rtarget_sessions", "Sessions logged in now.", m.SessionsActive.Load())
	counter("rtarget_sessions_total", "Sessions created.", m.SessionsTotal.Load())
	gauge("rtarget_qps", "Logged-in queue pairs now.", m.QPsActive.Load())
	counter("rtarget_login_failures_total", "Logins refused.", m.LoginFailures.Load())
	counter("rtarget_protocol_errors_total", "Sessions ended for a protocol violation.", m.ProtocolErrors.Load())
	counter("rtarget_read_bytes_total", "Bytes read by initiators.", m.BytesRead.Load())
	counter("rtarget_written_bytes_total", "Bytes written by initiators.", m.BytesWrit.Load())
	counter("rtarget_stale_tokens_total", "Commands refused for a stale fencing token.", m.StaleTokens.Load())
	counter("rtarget_reserved_refusals_total", "Commands refused for another session's reservation.", m.ReservedFails.Load())
	counter("rtarget_read_lease_expired_total", "READ buffers revoked without RELEASE.", m.LeaseExpired.Load())
	counter("rtarget_locks_cleared_total", "Locks and reservations cleared at session end.", m.LocksCleared.Load())
	counter("rtarget_volumes_fenced_total", "Volumes another target took over (their sessions here ended).", m.Fenced.Load())
	writeOps(w, "rtarget", "commands", &m.Ops, &m.Errors, &m.Latency)
}

// writeOps writes the per-operation counters and latency histograms under
// prefix (rtarget for the native protocol, rtarget_nvmf for NVMe/RDMA).
func writeOps(w *bufio.Writer, prefix, what string, ops, errs *[target.NumOps]atomic.Uint64, lat *[target.NumOps]target.Histogram) {
	What := strings.ToUpper(what[:1]) + what[1:]
	fmt.Fprintf(w, "# HELP %s_ops_total %s completed.\n# TYPE %s_ops_total counter\n", prefix, What, prefix)
	for k := target.OpKind(0); k < target.NumOps; k++ {
		fmt.Fprintf(w, "%s_ops_total{op=%q} %d\n", prefix, k.String(), ops[k].Load())
	}
	fmt.Fprintf(w, "# HELP %s_op_errors_total %s answered with an error status.\n# TYPE %s_op_errors_total counter\n", prefix, What, prefix)
	for k := target.OpKind(0); k < target.NumOps; k++ {
		fmt.Fprintf(w, "%s_op_errors_total{op=%q} %d\n", prefix, k.String(), errs[k].Load())
	}
	fmt.Fprintf(w, "# HELP %s_op_seconds Latency of %s, arrival to answer.\n# TYPE %s_op_seconds histogram\n", prefix, what, prefix)
	for k := target.OpKind(0); k < target.NumOps; k++ {
		h := &lat[k]
		var cum uint64
		for i, b := range target.LatencyBuckets {
			cum += h.Buckets[i].Load()
			fmt.Fprintf(w, "%s_op_seconds_bucket{op=%q,le=\"%g\"} %d\n", prefix, k.String(), b.Seconds(), cum)
		}
		cum += h.Buckets[len(target.LatencyBuckets)].Load()
		fmt.Fprintf(w, "%s_op_seconds_bucket{op=%q,le=\"+Inf\"} %d\n", prefix, k.String(), cum)
		fmt.Fprintf(w, "%s_op_seconds_sum{op=%q} %g\n", prefix, k.String(), float64(h.SumNs.Load())/1e9)
		fmt.Fprintf(w, "%s_op_seconds_count{op=%q} %d\n", prefix, k.String(), h.Count.Load())
	}
}

// writeNVMFMetrics writes the NVMe/RDMA front end's counters.
func writeNVMFMetrics(w *bufio.Writer, m *nvmf.Metrics) {
	gauge, counter := writers(w)
	gauge("rtarget_nvmf_controllers", "NVMe/RDMA controllers now (discovery ones included).", m.Controllers.Load())
	counter("rtarget_nvmf_controllers_total", "NVMe/RDMA controllers created.", m.ControllersTotal.Load())
	gauge("rtarget_nvmf_queues", "NVMe/RDMA queues connected now.", m.Queues.Load())
	counter("rtarget_nvmf_connect_failures_total", "NVMe/RDMA connections and Connect commands refused.", m.ConnectFailures.Load())
	counter("rtarget_nvmf_protocol_errors_total", "NVMe/RDMA queues ended for a transport or protocol error.", m.ProtocolErrors.Load())
	counter("rtarget_nvmf_keep_alive_expired_total", "NVMe/RDMA controllers dropped for a silent host.", m.KeepAliveExpired.Load())
	counter("rtarget_nvmf_read_bytes_total", "Bytes read by NVMe/RDMA hosts.", m.BytesRead.Load())
	counter("rtarget_nvmf_written_bytes_total", "Bytes written by NVMe/RDMA hosts.", m.BytesWrit.Load())
	counter("rtarget_nvmf_reservation_conflicts_total", "NVMe/RDMA commands refused for a reservation.", m.ReservationConflicts.Load())
	counter("rtarget_nvmf_in_capsule_writes_total", "NVMe/RDMA writes whose data came in the command capsule.", m.InCapsuleWrites.Load())
	writeOps(w, "rtarget_nvmf", "NVMe/RDMA I/O commands", &m.Ops, &m.Errors, &m.Latency)
}
