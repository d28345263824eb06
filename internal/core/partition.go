package core

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Partition is a bounded, append-only log. Offsets are dense from 0 and never
// reused: trimming moves the earliest offset up, never the end down.
//
// The log is full for a new record when it holds MaxMessages records, or,
// with MaxBytes, when the record's key, value and headers would take the
// bytes it holds past MaxBytes. Records leave in three ways, all under mu, each as
// many times as the new record needs, and each is counted, so
// Earliest == Reclaimed + Dropped + Expired always:
//   - reclaim: when the log is full, the oldest record is freed if every
//     subscribed group has committed past it (Reclaimed). Nothing is freed
//     earlier, so a group can replay what it already read.
//   - drop: under DropOldest, when reclaiming is not enough, the oldest
//     record goes even if a group has not read it (counted in Dropped).
//     While no group is subscribed, a full log drops its oldest record
//     under Block too: nobody could make room, and a producer must not
//     wait for a reader that may never come. A group created later finds
//     the newest records. Block waits only for groups.
//   - expiry: records older than MaxAge go on the next append or read
//     (counted in Expired).
//
// A group that finds its offset trimmed skips to the earliest record and
// counts the gap; see worker.
type Partition struct {
	topic string
	index int
	ret   Retention
	clock Clock      // for MaxAge: how old a record is (Broker.ageClock)
	ids   *recordIDs // names the records when the broker has no IDSource
	obs   Observer   // the broker's; nil when nothing observes
	free  *sync.Pool // the topic's reclaimed records; see release

	// trimsUnread is whether retention can trim a record a group has not
	// committed: DropOldest or MaxAge. Without either, records leave only by
	// reclaim, below every cursor, so a worker need not check that the
	// record in its hands is still retained.
	trimsUnread bool

	// ring holds the retained records. Slots are written under mu and read
	// without it (see Read).
	ring ring

	// The fields above never change; the groups below are each written by
	// someone else, and kept on their own cache lines so that a write to
	// one does not make the readers of the others miss: every append writes
	// end, and every commit reads roomArmed.
	_ cacheLinePad

	// end mirrors next for readers that take no lock: a worker reading
	// records, Drain, Lag. earliest mirrors base for the workers of a
	// partition whose retention trims unread records (trimsUnread), which
	// check that a record is still retained before each delivery; without
	// trimsUnread it is not kept, which saves a store per append to the
	// line the readers poll. Both are written under mu.
	end, earliest atomic.Int64
	_             cacheLinePad

	// roomArmed says a producer waits for room on the room channel.
	// Committers read it without mu: see notifyCommit.
	roomArmed atomic.Bool
	_         cacheLinePad

	mu         sync.Mutex     // guards everything below
	size       int            // records retained: next - base
	bytes      int64          // bytes of the records retained, headers included (recordBytes)
	base, next int64          // offsets of the oldest retained record and of the next one
	cursors    []subscriber   // one per subscribed group: the low-water mark is their minimum
	lowWater   int64          // a low-water mark the cursors were at or past; see reclaimLocked
	sealed     bool           // Close began, or the topic was deleted: appends fail with sealErr
	sealErr    error          // ErrClosed, or ErrTopicNotFound for a deleted topic
	readers    []reader       // readers waiting for the next append; see Read
	room       chan struct{}  // made by a producer that waits for room, closed when room may have appeared or on seal
	stats      PartitionStats // Reclaimed, Dropped, Expired, Blocked, TimedOut
}

// subscriber is a group's cursor on the partition, with the group's name
// to say who holds the oldest record when a producer gives up on room.
type subscriber struct {
	group  string
	cursor *Cursor
}

// cacheLinePad separates fields that different goroutines write: 64 bytes,
// a cache line on amd64 and most arm64 cores.
type cacheLinePad [64]byte

// reader is a worker waiting for records: the next append rings its bell.
// A bell has room for one ring, so ringing never blocks and a ring is never
// lost. One entry per cursor: a restarted worker replaces its predecessor's.
type reader struct {
	cursor *Cursor
	bell   chan struct{}
}

func newPartition(topic string, index int, ret Retention, clock Clock, free *sync.Pool, obs Observer) *Partition {
	trimsUnread := ret.OnFull == DropOldest || ret.MaxAge > 0
	return &Partition{
		topic:       topic,
		index:       index,
		ret:         ret,
		clock:       clock,
		free:        free,
		obs:         obs,
		trimsUnread: trimsUnread,
		ring:        newRing(ret.MaxMessages, trimsUnread),
	}
}

// End is the offset the next record will get.
func (p *Partition) End() int64 { return p.end.Load() }

// trimmedBelow is the offset of the oldest retained record, without the
// lock, for the workers of a partition whose retention trims unread records
// (trimsUnread), which check it per delivery. Only there is it kept; see
// earliest. Everyone else asks Bounds.
func (p *Partition) trimmedBelow() int64 { return p.earliest.Load() }

// Read copies the records from offset on into dst, as many as fit, and
// returns how many it copied. When offset is below the earliest retained
// record it copies nothing and returns that earliest offset as skipTo. When
// offset is at the end it copies nothing and registers bell, for the cursor
// that reads, to be rung by the next append; then the caller waits on bell.
//
// Records already appended are read without the partition's lock: a worker
// that wakes takes every record appended since it last looked in one step,
// however many producers are appending. That is safe because a slot is
// written before the end offset that publishes it, and is not rewritten
// under a reader that may read it (see ring); where retention can trim
// unread records, a record names its own offset, so a slot that was reused
// meanwhile is recognised and the read stops there. Age retention, which
// trims on read, takes the lock.
func (p *Partition) Read(offset int64, dst []*Record, c *Cursor, bell chan struct{}) (n int, skipTo int64, waiting bool) {
	if p.ret.MaxAge <= 0 {
		end := p.end.Load()
		for n < len(dst) && offset+int64(n) < end {
			rec := p.ring.load(offset + int64(n))
			if rec == nil || rec.Offset != offset+int64(n) {
				break // trimmed, and the slot reused or emptied
			}
			dst[n] = rec
			n++
		}
		if n > 0 {
			return n, 0, false
		}
	}
	now := p.now()
	p.mu.Lock()
	defer p.unlockReporting(p.trimsLocked())
	p.expireLocked(now)
	switch {
	case offset < p.base:
		return 0, p.base, false
	case offset >= p.next:
		p.readers = slices.DeleteFunc(p.readers, func(r reader) bool { return r.cursor == c })
		p.readers = append(p.readers, reader{cursor: c, bell: bell})
		return 0, 0, true
	}
	for n < len(dst) && offset+int64(n) < p.next {
		dst[n] = p.ring.load(offset + int64(n))
		n++
	}
	return n, 0, false
}

// seal refuses further appends and wakes every blocked producer, which then
// fails with why (ErrClosed, or ErrTopicNotFound when the topic was
// deleted). Reads go on, so groups can drain. The first why stands.
func (p *Partition) seal(why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.sealed {
		p.sealed, p.sealErr = true, why
		p.wakeProducersLocked()
	}
}

// Bounds returns the earliest retained offset and the end offset.
func (p *Partition) Bounds() (earliest, end int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.base, p.next
}

// Stats returns the partition's counters.
func (p *Partition) Stats() PartitionStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Earliest, s.End, s.Retained, s.RetainedBytes = p.base, p.next, p.size, p.bytes
	return s
}

// now reads the clock only when age retention needs it, and before taking mu:
// the clock is user code and runs under no lock of ours.
func (p *Partition) now() time.Time {
	if p.ret.MaxAge <= 0 {
		return time.Time{}
	}
	return p.clock.Now()
}
