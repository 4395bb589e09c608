package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rnic-dev/rnic/cmd/internal/clix"
	"github.com/rnic-dev/rnic/store"
	"github.com/rnic-dev/rnic/target/nvmf"
)

// listedVolume is one volume of rtarget volume list --json. Fields may be
// added (never renamed or removed); consumers ignore those they do not know.
type listedVolume struct {
	Name      string            `json:"name"`
	ID        uint32            `json:"id"`
	Kind      string            `json:"kind"`
	Size      int64             `json:"size"`
	Allocated int64             `json:"allocated"`
	Exclusive int64             `json:"exclusive"`
	Created   time.Time         `json:"created"`
	Origin    string            `json:"origin,omitempty"`
	RawPath   string            `json:"raw_path,omitempty"`
	Meta      map[string]string `json:"meta,omitempty"`
	Snapshots []listedSnapshot  `json:"snapshots"`
	// NQN is the NVMe/RDMA subsystem NQN rtarget serve --nvmf-listen
	// gives the volume ("" for a name too long to make one).
	NQN string `json:"nqn,omitempty"`
	// Unavailable is why the volume cannot be served now (a raw volume's
	// file or device gone), omitted when it can; its size is then 0.
	Unavailable string `json:"unavailable,omitempty"`
}

type listedSnapshot struct {
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	Exclusive int64     `json:"exclusive"`
	Created   time.Time `json:"created"`
	Clones    []string  `json:"clones,omitempty"`
}

func listed(v store.VolumeInfo) listedVolume {
	lv := listedVolume{Name: v.Name, ID: v.ID, Kind: v.Kind, Size: v.Size, Allocated: v.Allocated, Exclusive: v.Exclusive,
		Created: v.Created, Origin: v.Origin, RawPath: v.RawPath, Meta: v.Meta, Snapshots: []listedSnapshot{},
		NQN: nvmf.SubsystemNQN("", v.Name), Unavailable: v.Unavailable}
	for _, s := range v.Snapshots {
		lv.Snapshots = append(lv.Snapshots, listedSnapshot{Name: s.Name, Size: s.Size, Exclusive: s.Exclusive,
			Created: s.Created, Clones: s.Clones})
	}
	return lv
}

func writeVolumesJSON(w io.Writer, vs []store.VolumeInfo) error {
	out := make([]listedVolume, 0, len(vs))
	for _, v := range vs {
		out = append(out, listed(v))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// listRow is one line of the table: a volume, or a snapshot under it.
type listRow struct {
	vol  *listedVolume
	snap *listedSnapshot // nil on a volume's line
}

// listColumns are the columns of rtarget volume list, in order; a column
// is added here.
var listColumns = []struct {
	header string
	value  func(r listRow) string
}{
	{"NAME", func(r listRow) string {
		if r.snap != nil {
			return r.vol.Name + "@" + r.snap.Name
		}
		return r.vol.Name
	}},
	{"KIND", func(r listRow) string {
		if r.snap != nil {
			return "snapshot"
		}
		return r.vol.Kind
	}},
	{"SIZE", func(r listRow) string { return r.figure(clix.FormatSize(r.size())) }},
	{"BYTES", func(r listRow) string { return r.figure(strconv.FormatInt(r.size(), 10)) }},
	{"ALLOCATED", func(r listRow) string {
		if r.snap != nil {
			return "-"
		}
		return r.figure(clix.FormatSize(r.vol.Allocated))
	}},
	{"EXCLUSIVE", func(r listRow) string {
		if r.snap != nil {
			return clix.FormatSize(r.snap.Exclusive)
		}
		return r.figure(clix.FormatSize(r.vol.Exclusive))
	}},
	{"ORIGIN", func(r listRow) string {
		switch {
		case r.snap != nil && len(r.snap.Clones) > 0:
			return "clones: " + strings.Join(r.snap.Clones, ",")
		case r.snap == nil && r.vol.Origin != "":
			return r.vol.Origin
		case r.snap == nil && r.vol.RawPath != "":
			return r.vol.RawPath
		}
		return "-"
	}},
	{"CREATED", func(r listRow) string {
		if r.snap != nil {
			return r.snap.Created.Format(time.RFC3339)
		}
		return r.vol.Created.Format(time.RFC3339)
	}},
	{"NQN", func(r listRow) string {
		if r.snap != nil || r.vol.NQN == "" {
			return "-"
		}
		return r.vol.NQN
	}},
	// Last, since the cause of an unavailable volume is long.
	{"STATE", func(r listRow) string {
		switch {
		case r.snap != nil:
			return "-"
		case r.vol.Unavailable != "":
			return "unavailable: " + r.vol.Unavailable
		}
		return "ok"
	}},
}

// figure returns s, a size of the row's volume, or "-" when the volume is
// unavailable and its sizes unknown.
func (r listRow) figure(s string) string {
	if r.snap == nil && r.vol.Unavailable != "" {
		return "-"
	}
	return s
}

func (r listRow) size() int64 {
	if r.snap != nil {
		return r.snap.Size
	}
	return r.vol.Size
}

func writeVolumesTable(w io.Writer, vs []store.VolumeInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(cells []string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	var head []string
	for _, c := range listColumns {
		head = append(head, c.header)
	}
	line(head)
	for _, v := range vs {
		lv := listed(v)
		rows := []listRow{{vol: &lv}}
		for i := range lv.Snapshots {
			rows = append(rows, listRow{vol: &lv, snap: &lv.Snapshots[i]})
		}
		for _, r := range rows {
			var cells []string
			for _, c := range listColumns {
				cells = append(cells, c.value(r))
			}
			line(cells)
		}
	}
	return tw.Flush()
}
