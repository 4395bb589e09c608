package nvmf

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"sort"
)

// The discovery log page (NVMe over Fabrics 1.1 §5.3, Figures 37-38): a
// 1024-byte header, then one 1024-byte entry per NVM subsystem the host
// may connect to (its NQN is on the volume's allow-list, or the volume has
// none and the host came from a loopback address). The generation counter
// changes whenever the list does (it is a hash of the entries), so a host
// reading the log in pieces sees a change between them.

// Sizes of the discovery log.
const (
	DiscoveryHeaderLen = 1024
	DiscoveryEntryLen  = 1024
)

// Discovery log entry values.
const (
	TrTypeRDMA      = 1
	AdrFamIPv4      = 1
	AdrFamIPv6      = 2
	SubTypeNVMe     = 2
	RDMAQPTypeRC    = 1 // reliable connected
	RDMAPrTypeIWARP = 5
	RDMACMSRDMACM   = 1
)

// DiscoveryHeader is the discovery log's header.
type DiscoveryHeader []byte

func (h DiscoveryHeader) GenCtr() uint64 { return binary.LittleEndian.Uint64(h[0:]) }
func (h DiscoveryHeader) NumRec() uint64 { return binary.LittleEndian.Uint64(h[8:]) }
func (h DiscoveryHeader) RecFmt() uint16 { return binary.LittleEndian.Uint16(h[16:]) }

// DiscoveryEntry is one discovery log entry.
type DiscoveryEntry []byte

func (e DiscoveryEntry) TrType() uint8     { return e[0] }
func (e DiscoveryEntry) AdrFam() uint8     { return e[1] }
func (e DiscoveryEntry) SubType() uint8    { return e[2] }
func (e DiscoveryEntry) PortID() uint16    { return binary.LittleEndian.Uint16(e[4:]) }
func (e DiscoveryEntry) CntlID() uint16    { return binary.LittleEndian.Uint16(e[6:]) }
func (e DiscoveryEntry) ASQSz() uint16     { return binary.LittleEndian.Uint16(e[8:]) }
func (e DiscoveryEntry) TrSvcID() string   { s, _ := cstring(e[32:64]); return s }
func (e DiscoveryEntry) SubNQN() string    { s, _ := cstring(e[256:512]); return s }
func (e DiscoveryEntry) TrAddr() string    { s, _ := cstring(e[512:768]); return s }
func (e DiscoveryEntry) RDMAPrType() uint8 { return e[769] }

// DiscoveryEntryFields are the fields of an entry to encode (RDMA
// transport).
type DiscoveryEntryFields struct {
	AdrFam          uint8
	PortID          uint16
	TrSvcID, TrAddr string // NUL-padded, as Linux nvmet does
	SubNQN          string
}

// Encode writes f into e (1024 bytes): transport RDMA, an NVM subsystem,
// dynamic controllers (cntlid 0xFFFF), an admin queue of 32, reliable
// connected QPs of iWARP set up through the RDMA CM.
func (e DiscoveryEntry) Encode(f *DiscoveryEntryFields) {
	clear(e[:DiscoveryEntryLen])
	e[0], e[1], e[2] = TrTypeRDMA, f.AdrFam, SubTypeNVMe
	binary.LittleEndian.PutUint16(e[4:], f.PortID)
	binary.LittleEndian.PutUint16(e[6:], DynamicCntlID)
	binary.LittleEndian.PutUint16(e[8:], AdminQueueSize)
	copy(e[32:63], f.TrSvcID)
	copy(e[256:256+MaxNQNLen], f.SubNQN)
	copy(e[512:767], f.TrAddr)
	e[768], e[769], e[770] = RDMAQPTypeRC, RDMAPrTypeIWARP, RDMACMSRDMACM
}

// discoveryLog builds the whole log for this (discovery) controller's host.
func (c *controller) discoveryLog(ctx context.Context) ([]byte, error) {
	s := c.s
	vols, err := s.cfg.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	addr := s.cfg.Advertise
	if addr == "" {
		addr = c.local
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("nvmf: discovery address %q: %w", addr, err)
	}
	fam := uint8(AdrFamIPv4)
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		fam = AdrFamIPv6
	}
	var nqns []string
	for _, v := range vols {
		if v.Unavailable != "" {
			// A raw volume whose file or device is gone: a connect to it
			// would fail. It is listed again (a new generation of the
			// log) once it is back.
			continue
		}
		nqn := SubsystemNQN(s.cfg.NQNPrefix, v.Name)
		if nqn != "" && s.allowed(v.Name, c.hostNQN, c.remote) {
			nqns = append(nqns, nqn)
		}
	}
	sort.Strings(nqns)
	b := make([]byte, DiscoveryHeaderLen+len(nqns)*DiscoveryEntryLen)
	h := fnv.New64a()
	for i, nqn := range nqns {
		e := DiscoveryEntry(b[DiscoveryHeaderLen+i*DiscoveryEntryLen:])
		e.Encode(&DiscoveryEntryFields{AdrFam: fam, PortID: 1, TrSvcID: port, TrAddr: host, SubNQN: nqn})
		h.Write(e[:DiscoveryEntryLen])
	}
	binary.LittleEndian.PutUint64(b[0:], h.Sum64()|1) // never 0
	binary.LittleEndian.PutUint64(b[8:], uint64(len(nqns)))
	return b, nil
}
