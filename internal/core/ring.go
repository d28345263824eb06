package core

import "sync/atomic"

// ring holds a partition's retained records, record o in slot o % size. It is
// written under the partition's lock and read without it, behind the end
// offset that publishes each slot (see Partition.Read).
//
// A slot is read without the lock only below the end offset and at or past
// the reader's cursor. When retention frees records only by reclaim, that is
// enough to make plain slots safe: a slot is rewritten only after every
// group's cursor has passed its record, and a worker commits past a record
// (an atomic store the producer loads before reclaiming) only after it read
// the slot. Plain slots save a locked store per append (an atomic store is
// a full fence on x86).
//
// When retention can trim records a group has not read (DropOldest, MaxAge),
// a slot may be rewritten while a slow reader reads it, so the slots are
// atomic.
type ring struct {
	owned  []*Record                // reclaim only: plain slots
	shared []atomic.Pointer[Record] // retention trims unread records: atomic slots
}

func newRing(size int, trimsUnread bool) ring {
	if trimsUnread {
		return ring{shared: make([]atomic.Pointer[Record], size)}
	}
	return ring{owned: make([]*Record, size)}
}

// size is how many records the ring holds.
func (r *ring) size() int { return len(r.owned) + len(r.shared) }

// load returns the record in offset's slot: the record at offset, an older
// one whose slot it is, or nil.
func (r *ring) load(offset int64) *Record {
	if r.owned != nil {
		return r.owned[offset%int64(len(r.owned))]
	}
	return r.shared[offset%int64(len(r.shared))].Load()
}

// store puts rec in offset's slot.
func (r *ring) store(offset int64, rec *Record) {
	if r.owned != nil {
		r.owned[offset%int64(len(r.owned))] = rec
		return
	}
	r.shared[offset%int64(len(r.shared))].Store(rec)
}
