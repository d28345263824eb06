package core

import (
	"sync"
	"sync/atomic"
)

// Cursor holds one group's committed offset for one partition: the offset of
// the next record the group will read. It is the only copy of the group's
// progress, so a worker can stop at any moment and the next one resumes
// exactly here.
//
// Commit is a compare-and-set and moves only forward; Set is the only way
// backwards. A late ack from a worker that was interrupted by a seek fails
// its compare-and-set instead of clobbering the seek.
//
// Seal freezes the cursor for good: Close seals every cursor before it
// reports what was left, so a handler still running when Close gave up
// commits nothing afterwards. A sealed cursor holds -(offset+1), which no
// Commit expects.
type Cursor struct {
	next atomic.Int64 // lock-free: a worker commits once per record
	_    [56]byte     // a cache line of its own: the cursors of a partition's groups are written by different workers
}

// Committed returns the next offset to read.
func (c *Cursor) Committed() int64 {
	v := c.next.Load()
	if v < 0 {
		return -v - 1 // sealed
	}
	return v
}

// Commit moves the cursor from expected to next and reports whether it did:
// it does nothing when the cursor is not at expected, next is not ahead of
// it, or the cursor is sealed.
func (c *Cursor) Commit(expected, next int64) bool {
	return next > expected && c.next.CompareAndSwap(expected, next)
}

// Set moves the cursor to offset unconditionally, backwards included: it is
// how a seek or a replay lands. Only the cursor's partition calls it, under
// its lock (Partition.subscribe and Partition.seek): the partition caches the
// low-water mark of its cursors and must see every backward move.
func (c *Cursor) Set(offset int64) { c.next.Store(offset) }

// Seal freezes the cursor and returns its offset. Idempotent.
func (c *Cursor) Seal() int64 {
	for {
		v := c.next.Load()
		if v < 0 {
			return -v - 1
		}
		if c.next.CompareAndSwap(v, -v-1) {
			return v
		}
	}
}

// OffsetKey names one cursor.
type OffsetKey struct {
	Group     string
	Topic     string
	Partition int
}

// OffsetStore maps (group, topic, partition) to its Cursor. A key never seen
// reads as 0: a new group starts at the oldest record.
type OffsetStore struct {
	mu      sync.Mutex // guards cursors
	cursors map[OffsetKey]*Cursor
}

// NewOffsetStore returns an empty store.
func NewOffsetStore() *OffsetStore {
	return &OffsetStore{cursors: make(map[OffsetKey]*Cursor)}
}

// Cursor returns the cursor for k, creating it at offset 0.
func (s *OffsetStore) Cursor(k OffsetKey) *Cursor {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cursors[k]
	if !ok {
		c = &Cursor{}
		s.cursors[k] = c
	}
	return c
}
