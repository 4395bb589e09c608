package store

import "testing"

func newMemoryForTest(t *testing.T) Store { return NewMemory() }

func TestMemoryConformance(t *testing.T) { runConformance(t, newMemoryForTest) }
