package core

import (
	"hash/crc32"
	"sync"
	"sync/atomic"
)

// Partitioner picks the partition of a record from its encoded key (nil for
// a keyless record). It is called from every publishing goroutine at once and
// must return a value in [0, partitions).
type Partitioner interface {
	Partition(key []byte, partitions int) int
}

// hashKey is the key hash every keyed partitioner uses: CRC-32 (IEEE) of the
// encoded key, so a key lands on the same partition in every process and
// every release.
func hashKey(key []byte, partitions int) int {
	return int(crc32.ChecksumIEEE(key) % uint32(partitions))
}

type keyHash struct{ keyless roundRobin }

// KeyHash sends a keyed record to CRC-32(key) mod partitions and spreads
// keyless records round robin. It is the default.
func KeyHash() Partitioner { return &keyHash{} }

func (k *keyHash) Partition(key []byte, partitions int) int {
	if key == nil {
		return k.keyless.Partition(nil, partitions)
	}
	return hashKey(key, partitions)
}

type roundRobin struct{ next atomic.Uint64 }

// RoundRobin spreads records evenly and ignores keys, so records with equal
// keys are no longer ordered relative to each other. Use it when no order
// matters.
func RoundRobin() Partitioner { return &roundRobin{} }

func (r *roundRobin) Partition(_ []byte, partitions int) int {
	if partitions == 1 {
		return 0 // no shared counter to touch
	}
	return int((r.next.Add(1) - 1) % uint64(partitions))
}

type sticky struct {
	batch int

	mu      sync.Mutex // guards current and used
	current int
	used    int
}

// Sticky hashes keyed records like KeyHash and sends keyless records to one
// partition until batch of them went there, then moves to the next: fewer
// partitions touched per burst. batch < 1 is treated as 1.
func Sticky(batch int) Partitioner { return &sticky{batch: max(batch, 1)} }

func (s *sticky) Partition(key []byte, partitions int) int {
	if key != nil {
		return hashKey(key, partitions)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used >= s.batch {
		s.current, s.used = s.current+1, 0
	}
	s.used++
	return s.current % partitions
}
