package core

import (
	"context"
	"fmt"
	"time"

	"github.com/logbus/logbus/engine"
)

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
// (ErrClosed, or ErrTopicNotFound once the topic was deleted), ctx ends (ctx's error) or BlockTimeout passes without room
// for another record (ErrBackpressure): each record waits at most
// BlockTimeout, as if appended alone. Records stored before a wait are
// visible to readers at once. A record larger than MaxBytes could never
// fit: then Append stores nothing and fails with ErrInvalid.
//
// The records stored, and their keys, values and headers, belong to the log:
// the caller must not touch them afterwards.
func (p *Partition) Append(ctx context.Context, recs []*Record, offsets []int64) (int, error) {
	return p.appendFreeing(ctx, recs, offsets, nil)
}

// appendFreeing is Append that hands the records it reclaims to freed,
// when not nil, rather than to the topic's pool one by one: a batch takes
// them back in one step (see Topic.NewRecords).
func (p *Partition) appendFreeing(ctx context.Context, recs []*Record, offsets []int64, freed *[]*Record) (int, error) {
	if p.ret.MaxBytes > 0 { // Topic.Append checked, but Append is exported
		for _, rec := range recs {
			if err := p.tooLarge(rec); err != nil {
				return 0, err
			}
		}
	}
	var (
		n        int         // records stored
		timer    *time.Timer // started by a wait, shared by the later ones until a record is stored
		timedOut bool
		blocked  bool         // counted in stats.Blocked
		since    time.Time    // when the wait began, for the observer only
		looked   bool         // whether ctx was asked for the handler it may come from
		self     *handlerSlot // the handler that publishes, when its worker serves this partition
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		now := p.now()
		p.mu.Lock()
		before := p.trimsLocked()
		if p.sealed {
			p.unlockReporting(before)
			return n, fmt.Errorf("%w: partition %d", p.sealErr, p.index)
		}
		p.expireLocked(now)
		stored := n
		for n < len(recs) {
			size := recordBytes(recs[n])
			if !p.roomLocked(size, freed) {
				break
			}
			offsets[n] = p.storeLocked(recs[n], size)
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
			p.unlockReporting(before)
			return n, nil
		}
		// Full, under Block. Arm the room channel, then look at the cursors
		// once more (the cached low-water mark is used up, so roomLocked
		// reads them): a commit either lands before that look, and frees
		// room now, or finds the channel armed and closes it. See
		// notifyCommit.
		p.armRoomLocked()
		need := recordBytes(recs[n])
		if p.roomLocked(need, freed) {
			p.unlockReporting(before)
			continue
		}
		if timedOut { // the last look after the deadline found no room either
			p.stats.TimedOut++
			err := p.backpressureLocked(need)
			p.unlockReporting(before)
			if p.obs != nil {
				p.observeBackpressure(engine.EventBackpressureTimeout, time.Since(since), err)
			}
			return n, err
		}
		if !looked && p.ret.MaxAge <= 0 {
			// About to wait for the first time: ask ctx whether this is a
			// handler publishing into its own partition, outside mu
			// (ctx.Value may be user code), then look at the room again.
			looked = true
			p.unlockReporting(before)
			self = handlerOf(ctx, p)
			continue
		}
		if self != nil && p.waitsForItselfLocked(self) {
			p.stats.TimedOut++
			err := fmt.Errorf("%w: partition %d: group %q publishes from the handler of its record at offset %d, "+
				"which keeps the partition full until the handler returns: waiting could only end at BlockTimeout (%v)",
				ErrBackpressure, p.index, self.w.g.name, p.base, p.ret.BlockTimeout)
			p.unlockReporting(before)
			if p.obs != nil {
				p.observeBackpressure(engine.EventBackpressureTimeout, 0, err)
			}
			return n, err
		}
		began := !blocked
		if began {
			blocked = true
			p.stats.Blocked++
		}
		if timer == nil {
			timer = time.NewTimer(p.ret.BlockTimeout)
		}
		room := p.room
		expiry, stopExpiry := p.expiryLocked(now)
		p.unlockReporting(before)
		if began && p.obs != nil {
			since = time.Now()
			p.observeBackpressure(engine.EventBackpressureWait, 0, nil)
		}
		select {
		case <-room:
		case <-expiry:
		case <-timer.C:
			timedOut = true
		case <-ctx.Done():
			stopExpiry()
			return n, fmt.Errorf("partition %d: waiting for room: %w", p.index, ctx.Err())
		}
		stopExpiry()
	}
}

// waitsForItselfLocked reports whether a producer that found no room
// would wait for itself: it runs in the handler s of a worker w (its ctx
// says so), w's group has not committed the partition's oldest record, so nothing
// can be reclaimed before that handler returns, and no age limit can
// make room meanwhile (the caller checked MaxAge). The handler is in
// flight: the partition shows InFlight (with key concurrency: s handles
// that oldest record). That the publish runs on the
// handler's goroutine, and not on one it handed its ctx to, is taken on
// trust (see pubsub.Block). Neither another group holding the partition
// full too nor a revocation changes anything: this record must be
// committed first either way, and a partition moves to another member
// only once its worker's handler returned.
func (p *Partition) waitsForItselfLocked(s *handlerSlot) bool {
	if s.w.gp.cursor.Committed() > p.base {
		return false
	}
	if s.keyed {
		// Key concurrency: the group commits the oldest record only once
		// it settled; if it is the one this handler handles, nothing frees
		// room before the handler returns. If it is another's, it may
		// settle meanwhile, and this check runs again when the commit
		// wakes the producer.
		return s.offset.Load() == p.base
	}
	state, _, _ := unpackProgress(s.w.gp.progress.Load())
	return state == InFlight
}

// release hands a reclaimed record, if there is one, to whoever reuses it:
// appended to freed when not nil, else put in the topic's pool, for
// NewRecord.
func (p *Partition) release(rec *Record, freed *[]*Record) {
	switch {
	case rec == nil:
	case freed != nil:
		*freed = append(*freed, rec)
	default:
		p.free.Put(rec)
	}
}

// roomLocked makes room for a record of need bytes (recordBytes) if the
// retention allows it, and reports whether there is room. It frees the
// oldest records, as many as it takes: it reclaims what every group has
// committed, trims what no group reads (while no group is subscribed), or,
// under DropOldest, evicts what a group has not read; trims and drops are
// counted in Dropped. Reclaimed and trimmed records are released for
// reuse.
//
// A Block partition whose groups have not committed enough frees what
// they have committed and no more, and reports no room: the producer waits
// for the rest. So a producer that then times out may have freed records
// a replay could have read; nothing a group had not read.
func (p *Partition) roomLocked(need int64, freed *[]*Record) bool {
	for !p.fitsLocked(need) {
		if rec := p.reclaimLocked(); rec != nil {
			p.release(rec, freed) // the steady state of a full partition whose groups keep up
		} else {
			switch {
			case p.size == 0: // cannot be: a record larger than MaxBytes is refused before (tooLarge)
				return false
			case len(p.cursors) == 0:
				p.release(p.trimGrouplessLocked(), freed)
			case p.ret.OnFull == DropOldest:
				p.evictLocked(p.oldestLocked())
				p.stats.Dropped++
			default:
				return false
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
	return true
}

// fitsLocked reports whether the log has room for a record of need bytes
// without freeing any. The byte bound costs a field check when there is
// none.
func (p *Partition) fitsLocked(need int64) bool {
	return p.size < p.ring.size() && (p.ret.MaxBytes == 0 || p.bytes+need <= p.ret.MaxBytes)
}

// recordBytes is what a record counts against MaxBytes: its key, value
// and headers (engine.RecordBytes).
func recordBytes(rec *Record) int64 { return engine.RecordBytes(rec) }

// tooLarge fails a record that could never fit under MaxBytes, even in an
// empty log: it must fail at once, not wait or evict everything first. It
// is for a partition with a MaxBytes: its callers check that first, which
// spares the others a call per record.
func (p *Partition) tooLarge(rec *Record) error {
	if size := recordBytes(rec); size > p.ret.MaxBytes {
		return fmt.Errorf("%w: partition %d: a record of %s can never fit in MaxBytes %d",
			ErrInvalid, p.index, engine.DescribeSize(rec), p.ret.MaxBytes)
	}
	return nil
}

// storeLocked puts rec, of size bytes (recordBytes), at the end of the
// log and returns its offset. Readers see it once publishLocked moves the
// end past it.
func (p *Partition) storeLocked(rec *Record, size int64) int64 {
	offset := p.next
	rec.Offset = offset
	p.ring.store(offset, rec)
	p.size++
	p.next++
	p.bytes += size
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
