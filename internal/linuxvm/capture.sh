#!/usr/bin/env bash
# capture.sh OUTDIR [CACHE_DIR] - reproduces the captures behind internal/interop/README.md.
# Boots the linuxvm guest once per siw build and runs, guest to guest through the host
# ("hairpin": client -> 10.0.2.2:P -> host 127.0.0.1:P -> forward -> guest:P):
#   rping -C 2 -S 100 (stock) / -C 1 (crc1, server -q), rping -S 60000 (one big Read),
#   ib_send_bw, ib_write_bw, ib_read_bw with -R -n 5 -s 64, and ib_write_bw -R -n 5 -s 65536.
# Writes OUTDIR/<variant>-lo.pcap (tshark -i lo: the host-side TCP streams; slirp
# re-segments them), OUTDIR/<variant>-nic.pcap (the guest NIC, QEMU filter-dump: the guest's
# own TCP segments) and OUTDIR/<variant>.out (guest output). Needs root (tshark -i lo).
# Decode: tshark -r OUTDIR/stock-lo.pcap -Y iwarp_ddp_rdmap -T fields -e tcp.srcport -e _ws.col.Info -e tcp.payload
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [CACHE_DIR]" >&2; exit 2; }
mkdir -p "$1"; OUT=$(cd "$1" && pwd)
CACHE=${2:-${RNIC_VM_CACHE:-$HOME/.cache/rnic/linuxvm}}
[ -x "$CACHE/run-vm.sh" ] || { echo "no VM in $CACHE: run build.sh $CACHE first" >&2; exit 1; }
SHARE=$(mktemp -d); trap 'rm -rf "$SHARE"' EXIT
cat > "$SHARE/guest.sh" <<'EOF'
waitlisten() { local w=0; while ! netstat -ltn 2>/dev/null | grep -q ":$1 "; do
  w=$((w+1)); [ $w -gt 300 ] && return 1; sleep 0.1; done; }
Q=""; C=2; grep -q rnicvm.siw=crc1 /proc/cmdline && { Q=-q; C=1; }  # rev 1 has no IRD/ORD: see README
echo "== rping -C $C -S 100"
rping -s $Q -a 10.0.2.15 -p 7002 -S 100 -v >/tmp/rs 2>&1 &
waitlisten 7002; timeout 60 rping -c -a 10.0.2.2 -p 7002 -C $C -S 100 -v; echo "client rc=$?"; wait; echo "server rc=$?"; cat /tmp/rs
echo "== rping -S 60000"
rping -s $Q -a 10.0.2.15 -p 7005 -S 60000 >/tmp/rs 2>&1 &
waitlisten 7005; timeout 60 rping -c -a 10.0.2.2 -p 7005 -C 1 -S 60000; echo "client rc=$?"; wait; echo "server rc=$?"; cat /tmp/rs
P=7003
for t in send write read; do
  echo "== ib_${t}_bw -R -n 5 -s 64 (port $P)"
  ib_${t}_bw -R -p $P -n 5 -s 64 >/tmp/ps 2>&1 &
  waitlisten $P; sleep 0.5
  timeout 60 ib_${t}_bw -R -p $P -n 5 -s 64 10.0.2.2 >/tmp/pc 2>&1; echo "client rc=$?"; wait; echo "server rc=$?"
  tail -3 /tmp/pc; P=$((P+3))
done
echo "== ib_write_bw -R -n 5 -s 65536"
ib_write_bw -R -p 7004 -n 5 -s 65536 >/tmp/ps 2>&1 &
waitlisten 7004; sleep 0.5
timeout 60 ib_write_bw -R -p 7004 -n 5 -s 65536 10.0.2.2 >/tmp/pc 2>&1; echo "client rc=$?"; wait; echo "server rc=$?"
tail -3 /tmp/pc
EOF
for v in stock crc1; do
  tshark -i lo -q -w "$OUT/$v-lo.pcap" -f 'tcp portrange 7002-7009' >/dev/null 2>&1 & TP=$!
  sleep 2
  RNICVM_SIW=$v RNICVM_FORWARDS="7002 7003 7004 7005 7006 7009" RNICVM_PCAP="$OUT/$v-nic.pcap" \
    RNICVM_CONSOLE="$OUT/$v-console.log" RNICVM_TIMEOUT=300 "$CACHE/run-vm.sh" "$SHARE" > "$OUT/$v.out" 2>&1 || true
  sleep 1; kill "$TP"; wait "$TP" 2>/dev/null || true
  echo "$v: $(grep -c 'rc=0' "$OUT/$v.out") commands exited 0; $OUT/$v-lo.pcap $OUT/$v-nic.pcap"
done
