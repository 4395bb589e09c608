package store

import "sort"

// clusterRange is the physical clusters [start, end).
type clusterRange struct{ start, end uint64 }

// rangeSet is a set of physical clusters kept as sorted, disjoint,
// non-adjacent ranges. With changes set it records, by range start, the
// keys to write to make the database's free ranges equal to the set (end 0:
// delete the key).
type rangeSet struct {
	r       []clusterRange
	changes map[uint64]uint64
}

func (s *rangeSet) note(start, end uint64) {
	if s.changes != nil {
		s.changes[start] = end
	}
}

// find returns the index of the first range ending after p.
func (s *rangeSet) find(p uint64) int {
	return sort.Search(len(s.r), func(i int) bool { return s.r[i].end > p })
}

func (s *rangeSet) contains(p uint64) bool {
	i := s.find(p)
	return i < len(s.r) && s.r[i].start <= p
}

// add puts clusters [start, end) into the set; none of them may be in it.
func (s *rangeSet) add(start, end uint64) {
	i := s.find(start)
	mergeLeft := i > 0 && s.r[i-1].end == start
	mergeRight := i < len(s.r) && s.r[i].start == end
	switch {
	case mergeLeft && mergeRight:
		s.note(s.r[i].start, 0)
		s.r[i-1].end = s.r[i].end
		s.r = append(s.r[:i], s.r[i+1:]...)
		s.note(s.r[i-1].start, s.r[i-1].end)
	case mergeLeft:
		s.r[i-1].end = end
		s.note(s.r[i-1].start, end)
	case mergeRight:
		s.note(s.r[i].start, 0)
		s.r[i].start = start
		s.note(start, s.r[i].end)
	default:
		s.r = append(s.r, clusterRange{})
		copy(s.r[i+1:], s.r[i:])
		s.r[i] = clusterRange{start, end}
		s.note(start, end)
	}
}

// remove takes cluster p out of the set; it must be in it.
func (s *rangeSet) remove(p uint64) {
	i := s.find(p)
	r := s.r[i]
	switch {
	case r.start == p && r.end == p+1:
		s.r = append(s.r[:i], s.r[i+1:]...)
		s.note(p, 0)
	case r.start == p:
		s.r[i].start = p + 1
		s.note(p, 0)
		s.note(p+1, r.end)
	case r.end == p+1:
		s.r[i].end = p
		s.note(r.start, p)
	default:
		s.r[i].end = p
		s.note(r.start, p)
		s.r = append(s.r, clusterRange{})
		copy(s.r[i+2:], s.r[i+1:])
		s.r[i+1] = clusterRange{p + 1, r.end}
		s.note(p+1, r.end)
	}
}

// first returns the lowest cluster of the set.
func (s *rangeSet) first() (uint64, bool) {
	if len(s.r) == 0 {
		return 0, false
	}
	return s.r[0].start, true
}

// count returns the number of clusters in the set.
func (s *rangeSet) count() uint64 {
	var n uint64
	for _, r := range s.r {
		n += r.end - r.start
	}
	return n
}
