package ddp

import "iter"

// Segments yields the (offset, length) of each segment of a message of
// msgLen payload bytes cut into segments of at most maxPayload bytes, in
// order. A zero-length message yields (0, 0) once, since it still travels as
// one segment. A negative msgLen yields nothing; maxPayload < 1 means no
// limit (one segment).
func Segments(msgLen, maxPayload int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		if msgLen < 0 {
			return
		}
		if msgLen == 0 || maxPayload < 1 || maxPayload >= msgLen {
			yield(0, msgLen)
			return
		}
		for off := 0; off < msgLen; off += maxPayload {
			if !yield(off, min(maxPayload, msgLen-off)) {
				return
			}
		}
	}
}
