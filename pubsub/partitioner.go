package pubsub

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
)

// Partitioner picks a record's partition from its encoded key (nil for a
// keyless record). Partition is called from every publishing goroutine at
// once and must return a value in [0, partitions); anything else fails the
// publish with [ErrInvalid].
//
// Routing happens here, above the engine, so a key lands on the same
// partition whatever engine stores the topic.
type Partitioner interface {
	Partition(key []byte, partitions int) int
}

// WithPartitioner sets the partitioner, overriding [KeyHash]. A nil
// Partitioner is [ErrInvalid].
func WithPartitioner(p Partitioner) TopicOption {
	return topicOptionFunc(func(c *topicConfig) {
		if p == nil {
			c.invalid(fmt.Errorf("%w: WithPartitioner(nil)", ErrInvalid))
		}
		c.partitioner = p
	})
}

// hashKey is the key hash every keyed partitioner uses: CRC-32 (IEEE) of the
// encoded key, so a key lands on the same partition in every process and
// every release.
func hashKey(key []byte, partitions int) int {
	return int(checksumIEEE(key) % uint32(partitions))
}

// checksumIEEE is crc32.ChecksumIEEE, faster for short inputs such as keys:
// the library takes keys shorter than 16 bytes one byte at a time, this
// takes eight at a time (slicing-by-8). From 64 bytes on, the library's
// vector code is faster, so it is used.
func checksumIEEE(p []byte) uint32 {
	if len(p) >= 64 {
		return crc32.ChecksumIEEE(p)
	}
	t := &ieeeSlicing8
	crc := ^uint32(0)
	for ; len(p) >= 8; p = p[8:] {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[7][crc&0xff] ^ t[6][crc>>8&0xff] ^ t[5][crc>>16&0xff] ^ t[4][crc>>24] ^
			t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
	}
	for _, b := range p {
		crc = t[0][byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// ieeeSlicing8 holds the tables of checksumIEEE: ieeeSlicing8[0] is the
// byte-at-a-time table of the IEEE polynomial, and ieeeSlicing8[k][b] is the
// CRC of byte b followed by k zero bytes.
var ieeeSlicing8 = func() (t [8][256]uint32) {
	t[0] = *crc32.MakeTable(crc32.IEEE)
	for k := 1; k < 8; k++ {
		for b := range 256 {
			prev := t[k-1][b]
			t[k][b] = t[0][prev&0xff] ^ prev>>8
		}
	}
	return t
}()

type keyHash struct{ keyless roundRobin }

// KeyHash sends a keyed record to CRC-32 (IEEE) of its encoded key mod the
// partition count, the same in every process, release and engine, and
// spreads keyless records round robin. It is the default.
func KeyHash() Partitioner { return &keyHash{} }

func (k *keyHash) Partition(key []byte, partitions int) int {
	if key == nil {
		return k.keyless.Partition(nil, partitions)
	}
	return hashKey(key, partitions)
}

type roundRobin struct{ next atomic.Uint64 }

// RoundRobin spreads records evenly over the partitions and ignores keys, so
// records with equal keys are no longer ordered relative to each other. Use
// it when no order matters.
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

// Sticky hashes keyed records like [KeyHash] and sends keyless records to
// one partition until batch of them went there, then moves to the next:
// fewer partitions touched per burst. batch < 1 is treated as 1.
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
