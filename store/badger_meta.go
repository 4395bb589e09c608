package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// volumeRecord is the stored form of a VolumeInfo (JSON, under volumeKey).
type volumeRecord struct {
	Version int               `json:"v"`
	Name    string            `json:"name"`
	ID      uint32            `json:"id"`
	Size    int64             `json:"size"`
	Created time.Time         `json:"created"`
	Meta    map[string]string `json:"meta,omitempty"`
}

const volumeRecordVersion = 1

func encodeVolumeRecord(info VolumeInfo) ([]byte, error) {
	b, err := json.Marshal(volumeRecord{
		Version: volumeRecordVersion,
		Name:    info.Name,
		ID:      info.ID,
		Size:    info.Size,
		Created: info.Created,
		Meta:    info.Meta,
	})
	if err != nil {
		return nil, fmt.Errorf("encode volume record: %w", err)
	}
	return b, nil
}

// decodeVolumeRecord parses a stored record and checks it against the name
// it was stored under.
func decodeVolumeRecord(name string, b []byte) (VolumeInfo, error) {
	var r volumeRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return VolumeInfo{}, fmt.Errorf("volume record %q: %v: %w", name, err, ErrCorrupt)
	}
	switch {
	case r.Version != volumeRecordVersion:
		return VolumeInfo{}, fmt.Errorf("volume record %q: version %d, want %d: %w", name, r.Version, volumeRecordVersion, ErrCorrupt)
	case r.Name != name:
		return VolumeInfo{}, fmt.Errorf("volume record %q names %q: %w", name, r.Name, ErrCorrupt)
	case r.ID == 0:
		return VolumeInfo{}, fmt.Errorf("volume record %q: id 0: %w", name, ErrCorrupt)
	case r.Size <= 0 || r.Size%BlockSize != 0:
		return VolumeInfo{}, fmt.Errorf("volume record %q: size %d: %w", name, r.Size, ErrCorrupt)
	}
	return VolumeInfo{Name: r.Name, ID: r.ID, Size: r.Size, Created: r.Created, Meta: r.Meta}, nil
}
