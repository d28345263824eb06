package core

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Partition is a bounded, append-only log. Offsets are dense from 0 and never
// reused: trimming moves the earliest offset up, never the end down.
//
// The log is full for a new record when it holds MaxMessages records, or,
// with MaxBytes, when the record's key and value would take the bytes it
// holds past MaxBytes. Records leave in three ways, all under mu, each as
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
	bytes      int64          // key and value bytes of the records retained (recordBytes)
	base, next int64          // offsets of the oldest retained record and of the next one
	cursors    []subscriber   // one per subscribed group: the low-water mark is their minimum
	lowWater   int64          // a low-water mark the cursors were at or past; see reclaimLocked
	sealed     bool           // Close began: appends fail with ErrClosed
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

func newPartition(topic string, index int, ret Retention, clock Clock, free *sync.Pool) *Partition {
	trimsUnread := ret.OnFull == DropOldest || ret.MaxAge > 0
	return &Partition{
		topic:       topic,
		index:       index,
		ret:         ret,
		clock:       clock,
		free:        free,
		trimsUnread: trimsUnread,
		ring:        newRing(ret.MaxMessages, trimsUnread),
	}
}

// Index is the partition's number within its topic.
func (p *Partition) Index() int { return p.index }

// End is the offset the next record will get.
func (p *Partition) End() int64 { return p.end.Load() }

// trimmedBelow is the offset of the oldest retained record, without the
// lock, for the workers of a partition whose retention trims unread records
// (trimsUnread), which check it per delivery. Only there is it kept; see
// earliest. Everyone else asks Bounds.
func (p *Partition) trimmedBelow() int64 { return p.earliest.Load() }

// Append stores recs at the end of the log, in order, and wakes the readers
// waiting for them. It returns how many it stored: all of them, or, on
// error, the first n (the others are not in the log). The offset of recs[i]
// goes to offsets[i], which must be as long as recs: once stored, a record
// may be read, committed and reclaimed for reuse before Append returns, so
// the caller must not read it back. The records reclaimed to make room go
// to the topic's pool, for Topic.NewRecord (see reclaimLocked).
//
// When the log is full it reclaims, drops or blocks as the retention says.
// A blocked Append waits until room appears, the partition is sealed
// (ErrClosed), ctx ends (ctx's error) or BlockTimeout passes without room
// for another record (ErrBackpressure): each record waits at most
// BlockTimeout, as if appended alone. Records stored before a wait are
// visible to readers at once. A record larger than MaxBytes could never
// fit: then Append stores nothing and fails with ErrInvalid.
//
// The records stored, and their keys, values and headers, belong to the log:
// the caller must not touch them afterwards.
func (p *Partition) Append(ctx context.Context, recs []*Record, offsets []int64) (int, error) {
	n, _, err := p.appendFreeing(ctx, recs, offsets, nil)
	return n, err
}

// AppendReusing is Append for a caller that reuses the records reclaimed to
// make room itself: they are appended to freed, which must not be nil, and
// returned, rather than put in the topic's pool one at a time (see batch).
func (p *Partition) AppendReusing(ctx context.Context, recs []*Record, offsets []int64, freed []*Record) (stored int, reclaimed []*Record, err error) {
	return p.appendFreeing(ctx, recs, offsets, freed)
}

// appendFreeing is Append and AppendReusing: with freed nil, the reclaimed
// records go to the pool.
func (p *Partition) appendFreeing(ctx context.Context, recs []*Record, offsets []int64, freed []*Record) (int, []*Record, error) {
	if p.ret.MaxBytes > 0 { // Topic.prepare checked, but Append is exported
		for _, rec := range recs {
			if err := p.tooLarge(rec); err != nil {
				return 0, freed, err
			}
		}
	}
	var (
		n        int         // records stored
		timer    *time.Timer // started by a wait, shared by the later ones until a record is stored
		timedOut bool
		blocked  bool // counted in stats.Blocked
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		now := p.now()
		p.mu.Lock()
		if p.sealed {
			p.mu.Unlock()
			return n, freed, fmt.Errorf("%w: partition %d", ErrClosed, p.index)
		}
		p.expireLocked(now)
		stored := n
		for n < len(recs) {
			var room bool
			if room, freed = p.roomLocked(recordBytes(recs[n]), freed); !room {
				break
			}
			offsets[n] = p.storeLocked(recs[n])
			n++
		}
		if n > stored {
			p.publishLocked()
			if timer != nil { // progress: the next record gets a BlockTimeout of its own
				timer.Stop()
				timer, timedOut = nil, false
			}
		}
		if n == len(recs) {
			p.mu.Unlock()
			return n, freed, nil
		}
		// Full, under Block. Arm the room channel, then look at the cursors
		// once more (the cached low-water mark is used up, so roomLocked
		// reads them): a commit either lands before that look, and frees
		// room now, or finds the channel armed and closes it. See
		// notifyCommit.
		p.armRoomLocked()
		need := recordBytes(recs[n])
		var fits bool
		if fits, freed = p.roomLocked(need, freed); fits {
			p.mu.Unlock()
			continue
		}
		if timedOut { // the last look after the deadline found no room either
			p.stats.TimedOut++
			err := p.backpressureLocked(need)
			p.mu.Unlock()
			return n, freed, err
		}
		if !blocked {
			blocked = true
			p.stats.Blocked++
		}
		if timer == nil {
			timer = time.NewTimer(p.ret.BlockTimeout)
		}
		room := p.room
		expiry, stopExpiry := p.expiryLocked(now)
		p.mu.Unlock()
		select {
		case <-room:
		case <-expiry:
		case <-timer.C:
			timedOut = true
		case <-ctx.Done():
			stopExpiry()
			return n, freed, fmt.Errorf("partition %d: waiting for room: %w", p.index, ctx.Err())
		}
		stopExpiry()
	}
}

// release hands a reclaimed record, if there is one, to whoever reuses it:
// appended to freed for AppendReusing, else to the topic's pool.
func (p *Partition) release(freed []*Record, rec *Record) []*Record {
	if rec == nil {
		return freed
	}
	if freed == nil {
		p.free.Put(rec)
		return nil
	}
	return append(freed, rec)
}

// roomLocked makes room for a record of need key and value bytes if the
// retention allows it, and reports whether there is room. It frees the
// oldest records, as many as it takes: it reclaims what every group has
// committed, trims what no group reads (while no group is subscribed), or,
// under DropOldest, evicts what a group has not read; trims and drops are
// counted in Dropped. Reclaimed and trimmed records are released to freed
// for reuse.
//
// A Block partition whose groups have not committed enough frees what
// they have committed and no more, and reports no room: the producer waits
// for the rest. So a producer that then times out may have freed records
// a replay could have read; nothing a group had not read.
func (p *Partition) roomLocked(need int64, freed []*Record) (bool, []*Record) {
	for !p.fitsLocked(need) {
		if rec := p.reclaimLocked(); rec != nil {
			freed = p.release(freed, rec) // the steady state of a full partition whose groups keep up
		} else {
			switch {
			case p.size == 0: // cannot be: a record larger than MaxBytes is refused before (tooLarge)
				return false, freed
			case len(p.cursors) == 0:
				freed = p.release(freed, p.trimGrouplessLocked())
			case p.ret.OnFull == DropOldest:
				p.evictLocked(p.oldestLocked())
				p.stats.Dropped++
			default:
				return false, freed
			}
		}
		if p.ret.MaxBytes > 0 {
			// One record may free several, whose slots no append rewrites
			// soon: empty the slot, else it keeps its record from the
			// garbage collector, and the memory the log holds is bounded by
			// MaxMessages rather than by MaxBytes. No reader reads it: see
			// evictLocked, and where unread records are dropped the slots
			// are atomic and a reader stops at an empty one (see Read).
			p.ring.store(p.base-1, nil)
		}
	}
	return true, freed
}

// fitsLocked reports whether the log has room for a record of need bytes
// without freeing any. The byte bound costs a field check when there is
// none.
func (p *Partition) fitsLocked(need int64) bool {
	return p.size < p.ring.size() && (p.ret.MaxBytes == 0 || p.bytes+need <= p.ret.MaxBytes)
}

// recordBytes is what a record counts against MaxBytes: its key and value.
// Headers, and the record's own bookkeeping, are not counted.
func recordBytes(rec *Record) int64 { return int64(len(rec.Key) + len(rec.Value)) }

// tooLarge fails a record that could never fit under MaxBytes, even in an
// empty log: it must fail at once, not wait or evict everything first.
func (p *Partition) tooLarge(rec *Record) error {
	if size := recordBytes(rec); p.ret.MaxBytes > 0 && size > p.ret.MaxBytes {
		return fmt.Errorf("%w: topic %q partition %d: a record of %d bytes (key %d + value %d) can never fit in MaxBytes %d",
			ErrInvalid, p.topic, p.index, size, len(rec.Key), len(rec.Value), p.ret.MaxBytes)
	}
	return nil
}

// storeLocked puts rec at the end of the log and returns its offset.
// Readers see it once publishLocked moves the end past it.
func (p *Partition) storeLocked(rec *Record) int64 {
	offset := p.next
	rec.Offset = offset
	p.ring.store(offset, rec)
	p.size++
	p.next++
	p.bytes += recordBytes(rec)
	return offset
}

// publishLocked makes the stored records visible and rings the bells of the
// readers waiting for them.
func (p *Partition) publishLocked() {
	p.publishEarliestLocked()
	p.end.Store(p.next)
	for i, r := range p.readers {
		select {
		case r.bell <- struct{}{}:
		default: // already rung
		}
		p.readers[i] = reader{}
	}
	p.readers = p.readers[:0]
}

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
	defer p.mu.Unlock()
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

// notifyCommit wakes the producers blocked for room after a group
// committed. It costs one atomic load when nobody waits, which is every
// commit on an unblocked partition, and only the first commit after a
// producer armed the room channel takes the lock: a wait costs one wake-up
// however many groups commit meanwhile.
//
// Why no wake-up is lost: a producer arms the channel (under mu) before its
// last look at the cursors, a committer writes its cursor before it loads
// roomArmed, and both are sequentially consistent atomics, so at least one
// of them sees the other. If the producer saw the commit it has room; if
// the committer saw the channel armed it takes mu, which the producer holds
// until it has taken the channel it will wait on, and closes that very
// channel.
func (p *Partition) notifyCommit() {
	if !p.roomArmed.Load() || !p.roomArmed.CompareAndSwap(true, false) {
		return
	}
	p.mu.Lock()
	p.wakeProducersLocked()
	p.mu.Unlock()
}

// armRoomLocked makes sure the room channel exists and tells committers
// that a producer is about to wait on it.
func (p *Partition) armRoomLocked() {
	if p.room == nil {
		p.room = make(chan struct{})
	}
	p.roomArmed.Store(true)
}

// wakeProducersLocked wakes every producer waiting on the room channel.
func (p *Partition) wakeProducersLocked() {
	if p.room != nil {
		close(p.room)
		p.room = nil
	}
	p.roomArmed.Store(false)
}

// subscribe makes the cursor of a new group, named group, part of the
// low-water mark and starts it where from says, in one step under the lock,
// so no record before that point is ever read by the group. What was
// trimmed before the group existed is not the group's loss, so it is not
// counted as skipped.
func (p *Partition) subscribe(c *Cursor, group string, from Start) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.Set(p.startLocked(from))
	p.cursors = append(p.cursors, subscriber{group: group, cursor: c})
	p.lowWater = min(p.lowWater, c.Committed())
}

// startLocked returns the offset from names: within [base, next].
func (p *Partition) startLocked(from Start) int64 {
	switch from.Kind {
	case StartLatest:
		return p.next
	case StartOffset:
		return min(max(from.Offset, p.base), p.next)
	case StartTime:
		// Created follows the clock, which a test may move back: look at
		// every retained record rather than bisect.
		for o := p.base; o < p.next; o++ {
			if !p.ring.load(o).Created.Before(from.Time) {
				return o
			}
		}
		return p.next
	}
	return p.base
}

// backpressureLocked is the error of a producer that found no room for a
// record of need bytes for BlockTimeout. It names the group holding the
// oldest record, the one whose committed offset is lowest: room appears
// only when that group commits, so it is the group to look at (one
// abandoned consumer holds back every producer of the partition). Groups
// tied with it are counted, not named.
func (p *Partition) backpressureLocked(need int64) error {
	full := fmt.Sprintf("%d records (MaxMessages)", p.size)
	if p.size < p.ring.size() {
		full = fmt.Sprintf("%d of %d bytes (MaxBytes) with %d more to store", p.bytes, p.ret.MaxBytes, need)
	}
	if len(p.cursors) == 0 { // cannot be: without a group, Block does not wait
		return fmt.Errorf("%w: partition %d: full at %s for %v",
			ErrBackpressure, p.index, full, p.ret.BlockTimeout)
	}
	slowest, low, ties := p.cursors[0].group, p.cursors[0].cursor.Committed(), 0
	for _, s := range p.cursors[1:] {
		switch c := s.cursor.Committed(); {
		case c < low:
			slowest, low, ties = s.group, c, 0
		case c == low:
			ties++
		}
	}
	var also string
	switch ties {
	case 0:
	case 1:
		also = " (as does 1 other group)"
	default:
		also = fmt.Sprintf(" (as do %d other groups)", ties)
	}
	return fmt.Errorf("%w: partition %d: group %q holds the oldest record, offset %d%s; full at %s for %v",
		ErrBackpressure, p.index, slowest, p.base, also, full, p.ret.BlockTimeout)
}

// expiryLocked returns a channel that fires when the oldest record becomes
// old enough for MaxAge to trim it, so a producer blocked on a full
// partition wakes when age retention makes room, and the function that
// releases its timer. Without MaxAge the channel is nil: it never fires.
// The clock may be a manual one; then the timer only makes the producer
// look again, which is harmless.
func (p *Partition) expiryLocked(now time.Time) (<-chan time.Time, func() bool) {
	if p.ret.MaxAge <= 0 || p.size == 0 {
		return nil, func() bool { return false }
	}
	// A record is trimmed once it is strictly older than MaxAge.
	due := p.oldestLocked().Created.Add(p.ret.MaxAge).Sub(now) + time.Nanosecond
	t := time.NewTimer(max(due, 0))
	return t.C, t.Stop
}

// seek moves c to offset, which must lie within [base, next]: else
// ErrOffsetOutOfRange. Holding mu makes the range check and the move one
// step, so no reclaim slips between them.
func (p *Partition) seek(c *Cursor, offset int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < p.base || offset > p.next {
		return p.outOfRange(offset, p.base, p.next)
	}
	p.moveLocked(c, offset)
	return nil
}

// seekStart moves c to where from says.
func (p *Partition) seekStart(c *Cursor, from Start) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moveLocked(c, p.startLocked(from))
}

func (p *Partition) moveLocked(c *Cursor, offset int64) {
	c.Set(offset)
	p.lowWater = min(p.lowWater, offset)
	p.wakeProducersLocked() // a forward seek can free room
}

// outOfRange is the error of a seek to offset outside [earliest, end].
func (p *Partition) outOfRange(offset, earliest, end int64) error {
	return fmt.Errorf("%w: topic %q partition %d: offset %d outside [%d, %d], the earliest retained and the end",
		ErrOffsetOutOfRange, p.topic, p.index, offset, earliest, end)
}

// seal refuses further appends and wakes every blocked producer, which then
// fails with ErrClosed. Reads go on, so groups can drain.
func (p *Partition) seal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.sealed {
		p.sealed = true
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

// reclaimLocked frees the oldest record if every subscribed group has
// committed past it. One at a time, as appends need room: the log keeps as
// many records as retention allows, so a replay reaches back as far as it
// can.
//
// The cursors are read only when the cached low-water mark is used up:
// cursors move forward by themselves, and backwards only through subscribe
// and seek, which lower the cache. So a producer that keeps up with its
// groups looks at their cursors once per run of freed records, not once per
// append, and does not pull the cursors' cache lines from the workers that
// write them.
//
// It returns the reclaimed record, or nil, for the producer to reuse with
// its key and value buffers (see Topic.NewRecord), so a topic whose groups
// keep up allocates no records (nor does one without groups: see
// trimGrouplessLocked). That is safe because nothing in the
// log refers to it any more: every group's cursor is past it, a worker reads
// only at or after its cursor and lets go of a record before it commits it,
// and a dead letter keeps a copy of the record and its bytes. Records that
// leave by drop or expiry may still be in a worker's hands, so they are
// left to the garbage collector.
func (p *Partition) reclaimLocked() *Record {
	if len(p.cursors) == 0 || p.size == 0 {
		return nil // no group: nothing to reclaim for (roomLocked drops instead)
	}
	if p.lowWater <= p.base {
		p.lowWater = p.cursors[0].cursor.Committed()
		for _, s := range p.cursors[1:] {
			p.lowWater = min(p.lowWater, s.cursor.Committed())
		}
		if p.lowWater <= p.base {
			return nil
		}
	}
	rec := p.oldestLocked()
	p.evictLocked(rec)
	p.stats.Reclaimed++
	recycle(rec)
	return rec
}

// trimGrouplessLocked evicts the oldest record of a partition no group
// reads, under any FullPolicy: nobody could make room, and a producer must
// not wait for a reader that may never come. It counts the record in
// Dropped and returns it for reuse, as reclaimLocked does.
//
// Nobody holds the record: a group's workers read only after subscribe
// added its cursor, under mu, and from then on the partition trims no
// more this way. For the same reason the plain slots of a partition that
// otherwise only reclaims (see ring) stay safe: no reader reads the slot
// the next append rewrites.
func (p *Partition) trimGrouplessLocked() *Record {
	rec := p.oldestLocked()
	p.evictLocked(rec)
	p.stats.Dropped++
	recycle(rec)
	return rec
}

// recycle empties rec for a producer to fill again, keeping its key and
// value buffers when they are small enough (see Topic.NewRecord).
func recycle(rec *Record) {
	*rec = Record{Key: reusable(rec.Key), Value: reusable(rec.Value)}
}

// maxReusedBuffer bounds the key and value buffers a reclaimed record
// keeps for reuse, so one large record does not make every later record
// that reuses its buffer hold as much.
const maxReusedBuffer = 1024

// reusable returns b emptied, to be appended to by a later record, or nil
// when b is too large to keep.
func reusable(b []byte) []byte {
	if cap(b) > maxReusedBuffer {
		return nil
	}
	return b[:0]
}

// expireLocked trims the records older than MaxAge.
func (p *Partition) expireLocked(now time.Time) {
	if p.ret.MaxAge <= 0 {
		return
	}
	cutoff := now.Add(-p.ret.MaxAge)
	for p.size > 0 {
		rec := p.oldestLocked()
		if !rec.Created.Before(cutoff) {
			break
		}
		p.ring.store(p.base, nil) // no append may come to reuse the slot soon
		p.evictLocked(rec)
		p.stats.Expired++
	}
	p.publishEarliestLocked()
}

func (p *Partition) oldestLocked() *Record { return p.ring.load(p.base) }

// evictLocked moves the start of the log past its oldest record, rec.
// Readers learn the new start from publishEarliestLocked. The slot is left
// as it is, which saves a store per append to a cache line the readers
// share: reclaim and drop evict to make room for the next append, and
// without MaxBytes the log is full, so that append's slot is this one, and
// it overwrites it. Until then no reader takes the reclaimed record from
// it: a reader reads only below the end, which the append moves past its
// slot after writing it, and at or past its cursor, which is past a
// reclaimed record (and a trimmed one has no reader). A dropped record
// may still be read; it is immutable and never reused. With MaxBytes,
// roomLocked empties the slot.
func (p *Partition) evictLocked(rec *Record) {
	p.bytes -= recordBytes(rec)
	p.size--
	p.base++
}

// publishEarliestLocked tells the workers that check it where the log
// starts now: once per append or trim rather than once per record, and only
// when retention trims unread records (see earliest).
func (p *Partition) publishEarliestLocked() {
	if p.trimsUnread && p.earliest.Load() != p.base {
		p.earliest.Store(p.base)
	}
}

// now reads the clock only when age retention needs it, and before taking mu:
// the clock is user code and runs under no lock of ours.
func (p *Partition) now() time.Time {
	if p.ret.MaxAge <= 0 {
		return time.Time{}
	}
	return p.clock.Now()
}
