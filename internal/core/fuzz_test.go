package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// FuzzPartitionLog runs one partition through a sequence of operations
// decoded from the input (publish a batch, read at an offset, commit a
// group's cursor, move the clock, subscribe a group) and after each one
// compares it with a model of the log:
//
//   - Offsets are dense from 0: a batch lands at End, End+1, ... and End
//     grows by the records stored.
//   - Read from an offset in [Earliest, End) returns min(len(dst), End-offset)
//     records in offset order, each with the bytes and time it was published
//     with; below Earliest it says skip to Earliest; at or past End it waits,
//     and the next append that stores a record rings its bell.
//   - A full log reclaims its oldest record exactly when every subscribed
//     group has committed past it, else drops it under DropOldest or when no
//     group is subscribed, or, under Block, gives up with ErrBackpressure
//     after BlockTimeout (1 ns here) having stored what fitted. MaxAge trims
//     records strictly older than it on the next append or read.
//   - Stats agrees with the model (RetainedBytes included) and Bounds,
//     Retained <= MaxMessages, and Earliest == Reclaimed + Dropped + Expired.
//
// The partition is driven from this goroutine only, so the model is exact;
// workers and their interleavings are the synctest and rapid tests' job.
// The log is reached through few, long-lived calls (Broker.CreateTopic,
// Topic.PublishBatch, Partition.Read, subscribe, Stats, Bounds and
// Cursor.Commit), gathered in logHarness so that a change to one of them is
// a one-line change here.
//
// Run it longer with
//
//	go test -run '^$' -fuzz '^FuzzPartitionLog$' -fuzztime 60s ./internal/core/
func FuzzPartitionLog(f *testing.F) {
	// data[0]: MaxMessages-1 (mod 8); data[1]: bit 0 DropOldest, bit 1 MaxAge
	// of 1-4 s (bits 2-3); then (op, arg) pairs, op%5 selecting publish,
	// read, commit, clock or subscribe. See the switch below.
	f.Add([]byte{2, 0, 0, 3, 1, 0})                          // Block, no group: the fourth record times out
	f.Add([]byte{1, 1, 4, 0, 0, 2, 0, 7, 2, 1, 0, 3, 1, 0})  // DropOldest with a group that commits
	f.Add([]byte{3, 2, 0, 1, 3, 40, 0, 1, 1, 0, 1, 9})       // MaxAge 1 s: records expire
	f.Add([]byte{0, 0, 4, 0, 0, 0, 2, 1, 0, 0, 1, 1, 21, 5}) // one slot, reclaimed record by record
	f.Add([]byte{7, 3, 4, 0, 9, 0, 0, 255, 0, 255, 7, 100, 3, 200, 1, 3, 0, 3})
	f.Fuzz(runPartitionLog)
}

// maxLogOps bounds the operations one input runs. The log holds at most
// eight records, so longer runs only revisit states, and short inputs keep
// each run, and the minimization of a failing one, fast.
const maxLogOps = 256

// runPartitionLog is FuzzPartitionLog's body.
func runPartitionLog(t *testing.T, data []byte) {
	if len(data) < 2 {
		return
	}
	ret := Retention{MaxMessages: 1 + int(data[0]%8), BlockTimeout: time.Nanosecond}
	if data[1]&1 != 0 {
		ret.OnFull = DropOldest
	}
	if data[1]&2 != 0 {
		ret.MaxAge = time.Duration(1+data[1]>>2%4) * time.Second
	}
	h := newLogHarness(t, ret)
	ops := data[2:]
	ops = ops[:min(len(ops), 2*maxLogOps)]
	for len(ops) > 0 {
		op, arg := ops[0], byte(0)
		if len(ops) > 1 {
			arg = ops[1]
		}
		ops = ops[min(2, len(ops)):]
		code, extra := op%5, int(op/5)
		switch code {
		case 0: // publish 1-4 records of 8 to about 2 KiB (buffers over 1 KiB are not reused)
			h.publish(1+int(arg%4), 8+int(arg>>2)*32)
		case 1: // read at an offset in [Earliest-2, End+1], not below 0, into 1-4 slots
			h.read(max(0, h.base-2+int64(arg)%(h.next-h.base+4)), 1+extra%4)
		case 2: // a group commits part of what it has not committed
			h.commit(extra, int64(arg))
		case 3: // time passes
			h.clock.Advance(time.Duration(arg) * 50 * time.Millisecond)
		case 4: // a new group subscribes
			h.subscribe()
		}
		h.check()
	}
}

// logHarness is one partition and the model FuzzPartitionLog checks it
// against.
type logHarness struct {
	t     *testing.T
	ret   Retention
	clock *manualClock
	topic *Topic
	part  *Partition
	store *OffsetStore

	reader *Cursor       // names the test's reads; never subscribed
	bell   chan struct{} // the reader's bell
	armed  bool          // a read found nothing and registered bell

	// The model.
	base, next int64
	sizes      []int       // by offset: value length
	created    []time.Time // by offset: when it was published
	cursors    []*Cursor
	committed  []int64 // by cursor
	counts     PartitionStats
}

func newLogHarness(t *testing.T, ret Retention) *logHarness {
	t.Helper()
	clock := &manualClock{now: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)}
	b, err := NewBroker(Config{Clock: clock}) // a Clock of its own: no clock goroutine
	if err != nil {
		t.Fatalf("NewBroker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	topic, err := b.CreateTopic("log", TopicSpec{Retention: ret})
	if err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	return &logHarness{
		t: t, ret: ret, clock: clock, topic: topic, part: topic.Partition(0),
		store: NewOffsetStore(), reader: &Cursor{}, bell: make(chan struct{}, 1),
	}
}

// expire is the model of MaxAge: records strictly older than it go.
func (h *logHarness) expire() {
	if h.ret.MaxAge <= 0 {
		return
	}
	cutoff := h.clock.Now().Add(-h.ret.MaxAge)
	for h.base < h.next && h.created[h.base].Before(cutoff) {
		h.base++
		h.counts.Expired++
	}
}

// publish appends n records of size bytes as one batch. Each value is its
// expected offset followed by that offset's low byte, so a record read back
// shows where it was meant to land and whether its buffer was reused while
// it was still retained.
func (h *logHarness) publish(n, size int) {
	t := h.t
	h.expire()
	now := h.clock.Now()
	want := 0 // records the model says fit
records:
	for range n {
		switch {
		case h.next-h.base < int64(h.ret.MaxMessages):
		case len(h.committed) > 0 && slices.Min(h.committed) > h.base:
			h.base++
			h.counts.Reclaimed++
		case h.ret.OnFull == DropOldest || len(h.cursors) == 0: // no group: Block does not wait, it trims
			h.base++
			h.counts.Dropped++
		default: // Block: nobody will make room within BlockTimeout
			h.counts.Blocked++
			h.counts.TimedOut++
			break records
		}
		h.sizes = append(h.sizes, size)
		h.created = append(h.created, now)
		h.next++
		want++
	}

	first := h.next - int64(want)
	landed := 0
	stored, err := h.topic.PublishBatch(context.Background(), n,
		func(i int, rec *Record) error {
			off := first + int64(i)
			rec.Value = binary.BigEndian.AppendUint64(rec.Value[:0], uint64(off))
			for range size - 8 {
				rec.Value = append(rec.Value, byte(off))
			}
			return nil
		},
		func(i int, pos Position) {
			if pos.Partition != 0 || pos.Offset != first+int64(i) {
				t.Fatalf("record %d of the batch landed at %+v, want partition 0 offset %d", i, pos, first+int64(i))
			}
			landed++
		})
	switch {
	case stored != want || landed != want:
		t.Fatalf("PublishBatch of %d stored %d (%d landed), %v; want %d stored", n, stored, landed, err, want)
	case want == n && err != nil:
		t.Fatalf("PublishBatch of %d: %v", n, err)
	case want < n && !errors.Is(err, ErrBackpressure):
		t.Fatalf("PublishBatch of %d into a full Block partition: got %v, want ErrBackpressure", n, err)
	}
	if want > 0 && h.armed {
		select {
		case <-h.bell:
		default:
			t.Fatalf("an append stored %d records but did not ring the bell of the reader waiting at the end", want)
		}
		h.armed = false
	}
}

// read reads at offset into a dst of length slots.
func (h *logHarness) read(offset int64, slots int) {
	t := h.t
	h.expire()
	dst := make([]*Record, slots)
	n, skipTo, waiting := h.part.Read(offset, dst, h.reader, h.bell)
	switch {
	case offset < h.base:
		if n != 0 || skipTo != h.base || waiting {
			t.Fatalf("Read(%d) below earliest %d = %d, skipTo %d, waiting %v; want skipTo %d", offset, h.base, n, skipTo, waiting, h.base)
		}
	case offset >= h.next:
		if n != 0 || !waiting {
			t.Fatalf("Read(%d) at end %d = %d, skipTo %d, waiting %v; want waiting", offset, h.next, n, skipTo, waiting)
		}
		h.armed = true
	default:
		want := min(int64(slots), h.next-offset)
		if int64(n) != want || waiting {
			t.Fatalf("Read(%d) of [%d, %d) into %d slots = %d, waiting %v; want %d", offset, h.base, h.next, slots, n, waiting, want)
		}
		for i, rec := range dst[:n] {
			h.checkRecord(offset+int64(i), rec)
		}
	}
}

func (h *logHarness) checkRecord(offset int64, rec *Record) {
	t := h.t
	if rec == nil || rec.Offset != offset {
		t.Fatalf("Read returned %v where offset %d belongs", rec, offset)
	}
	v := rec.Value
	if len(v) != h.sizes[offset] || binary.BigEndian.Uint64(v) != uint64(offset) {
		t.Fatalf("record %d holds %d bytes starting % x; want %d bytes starting with its offset", offset, len(v), v[:min(len(v), 8)], h.sizes[offset])
	}
	for i, c := range v[8:] {
		if c != byte(offset) {
			t.Fatalf("record %d byte %d = %#x, want %#x: its buffer was rewritten while retained", offset, 8+i, c, byte(offset))
		}
	}
	if !rec.Created.Equal(h.created[offset]) {
		t.Fatalf("record %d created %v, want %v", offset, rec.Created, h.created[offset])
	}
}

// commit moves cursor which%len forward by 1 + arg mod what it has left,
// never past End, as a worker does.
func (h *logHarness) commit(which int, arg int64) {
	if len(h.cursors) == 0 {
		return
	}
	i := which % len(h.cursors)
	cur := h.committed[i]
	if cur >= h.next {
		return
	}
	to := cur + 1 + arg%(h.next-cur)
	if !h.cursors[i].Commit(cur, to) {
		h.t.Fatalf("cursor %d: Commit(%d, %d) failed on a cursor at %d", i, cur, to, h.cursors[i].Committed())
	}
	h.committed[i] = to
}

// subscribe adds a group, at most four; it starts at the earliest record.
func (h *logHarness) subscribe() {
	if len(h.cursors) == 4 {
		return
	}
	group := fmt.Sprint("g", len(h.cursors))
	c := h.store.Cursor(OffsetKey{Group: group, Topic: "log"})
	h.part.subscribe(c, group, Start{})
	h.cursors = append(h.cursors, c)
	h.committed = append(h.committed, h.base)
	if got := c.Committed(); got != h.base {
		h.t.Fatalf("a new group starts at %d, want the earliest record %d", got, h.base)
	}
}

// check compares the partition's counters and bounds with the model.
func (h *logHarness) check() {
	t := h.t
	s := h.part.Stats()
	want := h.counts
	want.Earliest, want.End, want.Retained = h.base, h.next, int(h.next-h.base)
	for o := h.base; o < h.next; o++ {
		want.RetainedBytes += int64(h.sizes[o])
	}
	if s != want {
		t.Fatalf("Stats = %+v\nwant    %+v", s, want)
	}
	if s.Earliest != s.Reclaimed+s.Dropped+s.Expired {
		t.Fatalf("Earliest %d != Reclaimed %d + Dropped %d + Expired %d", s.Earliest, s.Reclaimed, s.Dropped, s.Expired)
	}
	if s.Retained > h.ret.MaxMessages {
		t.Fatalf("Retained %d > MaxMessages %d", s.Retained, h.ret.MaxMessages)
	}
	if earliest, end := h.part.Bounds(); earliest != s.Earliest || end != s.End || h.part.End() != s.End {
		t.Fatalf("Bounds = [%d, %d), End = %d; Stats says [%d, %d)", earliest, end, h.part.End(), s.Earliest, s.End)
	}
}
