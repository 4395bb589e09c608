//go:build ceph

package rbd

import "errors"

// Metadata returns the value of an image metadata key; ok is false when the
// key is not set.
func (im *Image) Metadata(key string) (value string, ok bool, err error) {
	v, err := im.img.GetMetadata(key)
	if err != nil {
		err = wrap("metadata get "+key, im.where, err)
		if errors.Is(err, ErrNotFound) {
			return "", false, nil
		}
		return "", false, err
	}
	return v, true, nil
}

// AllMetadata returns every metadata key of the image.
func (im *Image) AllMetadata() (map[string]string, error) {
	m, err := im.img.ListMetadata()
	return m, wrap("metadata list", im.where, err)
}

// SetMetadata sets an image metadata key. Like a write it needs the
// exclusive lock (librbd asks its owner when another client holds it).
func (im *Image) SetMetadata(key, value string) error {
	return wrap("metadata set "+key, im.where, im.img.SetMetadata(key, value))
}

// RemoveMetadata removes a key; removing a missing key is no error.
func (im *Image) RemoveMetadata(key string) error {
	err := wrap("metadata remove "+key, im.where, im.img.RemoveMetadata(key))
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}
