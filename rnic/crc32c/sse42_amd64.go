package crc32c

// sse42 is the SSE4.2 CRC32-instruction kernel's assembly (sse42_amd64.s),
// run by the three-stream driver of x3.go.
var sse42 = &x3Funcs{x3: crcSSE42x3, x3Copy: crcSSE42x3Copy, one: crcSSE42, oneCopy: crcSSE42Copy}
