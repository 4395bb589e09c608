// Package wiretest holds test helpers shared by the wire codec packages
// (mpa, ddp, rdmap), and the check of those codecs against an independent
// decoder, Wireshark's tshark: its tests write MPA connections built with
// the codecs into a pcap file (with a small pcap/IPv4/TCP writer of their
// own) and have tshark dissect them.
package wiretest
