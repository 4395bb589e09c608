//go:build !linux

package store

// mappedFileRSS and pageOutValueLogs are Linux-only; elsewhere the store
// does not trim its mapped value log pages.
func mappedFileRSS() (int64, error)                        { return 0, nil }
func pageOutValueLogs(dir string, evict bool) (int, error) { return 0, nil }

type rssProbe struct{}

func newRSSProbe() *rssProbe              { return &rssProbe{} }
func (*rssProbe) fileRSS() (int64, error) { return 0, nil }
func (*rssProbe) close()                  {}
