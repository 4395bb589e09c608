package nvmf

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// Fuzz targets for every decoder of bytes a host sends: the CM private
// data, the command capsule (command, data pointer, Connect data), and the
// whole command path of a live queue (FuzzQueue: arbitrary capsules sent by
// a real host over the engine, which must each get a completion or end the
// queue cleanly, and never crash or hang the target).

// linuxCMRequest is the private data Linux sends for a queue.
func linuxCMRequest(qid, size uint16) []byte {
	b := make([]byte, CMRequestLen)
	CMRequest(b).Encode(&CMRequestFields{QID: qid, HRQSize: size, HSQSize: size - 1})
	return b
}

func FuzzCMRequest(f *testing.F) {
	f.Add(linuxCMRequest(0, 32))
	f.Add(linuxCMRequest(1, 128))
	f.Add(append(linuxCMRequest(2, 128), 1, 2, 3, 4))
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, pd []byte) {
		if IsNVMeRequest(pd) != (len(pd) > 0) {
			t.Fatal("IsNVMeRequest")
		}
		r, err := ParseCMRequest(pd)
		if err != nil {
			var ce *CMRequestError
			if !errors.As(err, &ce) || ce.Status < CMRejectInvalidLen || ce.Status > CMRejectInvalidHRQSize {
				t.Fatalf("error %v is not a CM reject", err)
			}
			return
		}
		sq := int(r.HSQSize()) + 1
		limit := MaxQueueSize
		if r.QID() == 0 {
			limit = AdminQueueSize
		}
		if len(pd) < CMRequestLen || r.RecFmt() != 0 || sq < 2 || sq > limit || int(r.HRQSize()) < sq {
			t.Fatalf("accepted %x", pd)
		}
		b := make([]byte, CMRequestLen)
		CMRequest(b).Encode(&CMRequestFields{RecFmt: r.RecFmt(), QID: r.QID(), HRQSize: r.HRQSize(), HSQSize: r.HSQSize()})
		if string(b[:8]) != string(pd[:8]) {
			t.Fatalf("round trip % x != % x", b[:8], pd[:8])
		}
	})
}

// linuxCapsules are capsules Linux sends: admin Connect (keyed data),
// I/O Connect (in-capsule data), a 4 KiB read (keyed, invalidate), a 4 KiB
// write (in-capsule), a flush, a DSM.
func linuxCapsules() [][]byte {
	enc := func(f CommandFields, data []byte) []byte {
		b := make([]byte, CommandLen+len(data))
		f.Flags |= PSDTSGL << 6
		Command(b).Encode(&f)
		copy(b[CommandLen:], data)
		return b
	}
	cd := make([]byte, ConnectDataLen)
	ConnectData(cd).Encode(&ConnectDataFields{CntlID: DynamicCntlID, SubNQN: DefaultNQNPrefix + "vol0",
		HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100"})
	keyed := func(n uint32) SGLFields {
		return SGLFields{Type: SGLTypeKeyedData, Subtype: SGLSubInvalidate, Addr: 0x7f0000001000, Len: n, Key: 0x1938ac01}
	}
	inCap := func(n uint32) SGLFields { return SGLFields{Type: SGLTypeData, Subtype: SGLSubOffset, Len: n} }
	read := rw(IORead, 8, 1)
	read.DPTR = keyed(4096)
	write := rw(IOWrite, 8, 1)
	write.DPTR = inCap(4096)
	ranges := make([]byte, 4096)
	binary.LittleEndian.PutUint32(ranges[4:], 8)
	return [][]byte{
		enc(CommandFields{Opcode: OpcodeFabrics, NSID: FabricsConnect, DPTR: keyed(1024), CDW10_15: [6]uint32{0, 31, 5000}}, nil),
		enc(CommandFields{Opcode: OpcodeFabrics, NSID: FabricsConnect, DPTR: inCap(1024), CDW10_15: [6]uint32{1 << 16, 127}}, cd),
		enc(read, nil),
		enc(write, make([]byte, 4096)),
		enc(CommandFields{Opcode: IOFlush, NSID: 1, DPTR: SGLFields{Type: SGLTypeKeyedData}}, nil),
		enc(CommandFields{Opcode: IODSM, NSID: 1, DPTR: inCap(4096), CDW10_15: [6]uint32{0, 4}}, ranges),
		enc(CommandFields{Opcode: AdminIdentify, DPTR: keyed(4096), CDW10_15: [6]uint32{CNSController}}, nil),
	}
}

func FuzzCommand(f *testing.F) {
	for _, c := range linuxCapsules() {
		f.Add(c)
	}
	f.Add(make([]byte, 63))
	f.Fuzz(func(t *testing.T, capsule []byte) {
		c, err := ParseCommand(capsule)
		if err != nil {
			if len(capsule) >= CommandLen {
				t.Fatalf("refused %d bytes", len(capsule))
			}
			return
		}
		inCap := len(capsule) - CommandLen
		d, err := ParseData(c, inCap, 1<<20)
		if err != nil {
			var se *StatusError
			if !errors.As(err, &se) || !se.Status.DNR() {
				t.Fatalf("ParseData error %v is not a DNR status", err)
			}
		} else {
			switch {
			case d.InCapsule && uint64(d.Offset)+uint64(d.Len) > uint64(inCap):
				t.Fatalf("in-capsule data past the capsule: %+v, %d bytes", d, inCap)
			case d.Len > 1<<20:
				t.Fatalf("data of %d bytes accepted", d.Len)
			case d.Invalidate && (d.InCapsule || d.Len == 0):
				t.Fatalf("invalidate without keyed data: %+v", d)
			}
		}
		// Re-encoding the fields reproduces the command.
		f := CommandFields{Opcode: c.Opcode(), Flags: c.Flags(), CID: c.CID(), NSID: c.NSID(), CDW2: c.CDW(2), CDW3: c.CDW(3),
			MPTR: c.MPTR()}
		for i := range f.CDW10_15 {
			f.CDW10_15[i] = c.CDW(10 + i)
		}
		s := c.DPTR()
		f.DPTR = SGLFields{Type: s.Type(), Subtype: s.Subtype(), Addr: s.Addr(), Len: s.Len(), Key: s.Key()}
		b := make([]byte, CommandLen)
		Command(b).Encode(&f)
		if s.Type() == SGLTypeKeyedData || s.Type() == SGLTypeData {
			// Other descriptor types keep bytes the fields do not carry.
			if string(b) != string(capsule[:CommandLen]) && (s.Type() == SGLTypeKeyedData || string(b[:36]) != string(capsule[:36])) {
				t.Fatalf("round trip\n% x\n% x", b, capsule[:CommandLen])
			}
		}
		if cd, err := ParseConnectData(capsule[CommandLen:]); err == nil {
			sub, ok := cd.SubNQN()
			if ok && len(sub) > MaxNQNLen {
				t.Fatal("long subsystem NQN")
			}
			host, ok := cd.HostNQN()
			if ok && ValidNQN(host) && host[:4] != "nqn." {
				t.Fatal("ValidNQN")
			}
		}
	})
}

func FuzzQueue(f *testing.F) {
	for _, c := range linuxCapsules() {
		f.Add(byte(1), c)
	}
	f.Add(byte(0), linuxCapsules()[6])
	e := newTestEnv(f, envOpts{volumes: map[string]int64{"vol0": 1 << 20}})
	f.Fuzz(func(t *testing.T, which byte, capsule []byte) {
		if len(capsule) < CommandLen || len(capsule) > capLen {
			return
		}
		// A host of its own for each input (a shared one would be closed by
		// the first input's cleanup).
		h := connectHost(t, e.addr, e.srv.NQN("vol0"), hostOpts{kato: 600000})
		q := h.io[0]
		if which&1 == 0 {
			q = h.admin
		}
		c := Command(capsule)
		held := q.qid == 0 && c.Opcode() == AdminAsyncEvent
		r, _, err := q.do(CommandFields{}, cmdOpts{raw: capsule, timeout: 2 * time.Second})
		switch {
		case err == nil:
			if r.completion().SQID() != q.qid {
				t.Fatalf("completion of queue %d on queue %d", r.completion().SQID(), q.qid)
			}
		case errors.Is(err, errLost):
			if err := q.waitLost(5 * time.Second); err != nil {
				t.Fatal(err)
			}
		case held:
		default:
			t.Fatalf("no completion and the queue still up: %v", err)
		}
	})
}

// isLost reports whether the queue's connection is gone.
func (h *hostQueue) isLost() bool {
	select {
	case <-h.lost:
		return true
	default:
		return false
	}
}
