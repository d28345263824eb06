package core

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// TestOffsetStoreCompareAndSet: a late ack must not clobber a seek.
func TestOffsetStoreCompareAndSet(t *testing.T) {
	s := NewOffsetStore()
	k := OffsetKey{Group: "billing", Topic: "orders", Partition: 0}
	if got := s.Cursor(k).Committed(); got != 0 {
		t.Fatalf("a new cursor reads %d, want 0", got)
	}
	if !s.Cursor(k).Commit(0, 1) {
		t.Fatal("Commit(0→1) failed on a cursor at 0")
	}
	s.Cursor(k).Set(0) // a replay while offset 1 was in flight
	if s.Cursor(k).Commit(1, 2) {
		t.Fatal("the late ack of offset 1 moved the cursor after a seek")
	}
	if got := s.Cursor(k).Committed(); got != 0 {
		t.Fatalf("cursor at %d after the clobber attempt, want 0 (the seek)", got)
	}
	if s.Cursor(k).Commit(0, 0) || s.Cursor(k).Commit(0, -1) {
		t.Fatal("Commit moved the cursor backwards or nowhere")
	}
	other := OffsetKey{Group: "audit", Topic: "orders", Partition: 0}
	if !s.Cursor(other).Commit(0, 5) || s.Cursor(k).Committed() != 0 {
		t.Fatal("groups do not have independent cursors")
	}
}

func TestDeadLetterQueueIsBounded(t *testing.T) {
	q := deadLetters{limit: 2}
	for i := range 5 {
		q.add(DeadLetter{Attempts: i})
	}
	letters, evicted := q.snapshot()
	if len(letters) != 2 || letters[0].Attempts != 3 || letters[1].Attempts != 4 || evicted != 3 {
		t.Errorf("got %d letters %+v and %d evicted, want the newest two and 3 evicted", len(letters), letters, evicted)
	}
}

// The formatted ID blocks of the whole retention window are kept: a group
// reading the oldest retained record after another read the newest finds
// its block, not a copy formatted again.
func TestDefaultIDsKeepTheRetentionWindow(t *testing.T) {
	ids := newRecordIDs(newBrokerIDPrefix(), 1, 0, 1024)
	ids.id(0)
	first := ids.recent[0].Load()
	for off := range int64(1024) { // a group far ahead reads the rest of the window
		ids.id(off)
	}
	ids.id(1)
	if ids.recent[0].Load() != first {
		t.Fatal("the block of offset 0 was formatted again while offset 0 was still retained")
	}
}

// A reclaimed record keeps its buffers for reuse only up to maxReusedBuffer
// bytes, so one large record does not make later ones hold as much.
func TestReusableBuffersAreBounded(t *testing.T) {
	small := make([]byte, 64, maxReusedBuffer)
	if got := reusable(small); len(got) != 0 || cap(got) != maxReusedBuffer {
		t.Errorf("reusable(cap %d) = len %d cap %d, want len 0 cap %d", cap(small), len(got), cap(got), maxReusedBuffer)
	}
	if got := reusable(make([]byte, maxReusedBuffer+1)); got != nil {
		t.Errorf("reusable(cap %d) kept the buffer, want nil", maxReusedBuffer+1)
	}
}

func TestDefaultIDsNameThePosition(t *testing.T) {
	prefix := newBrokerIDPrefix()
	ids := newRecordIDs(prefix, 3, 1, 4*idBlockLen) // a window of 4 blocks, smaller than the gap below
	seen := map[string]int64{}
	// Offsets in the order two groups far apart would ask for them, so the
	// shared blocks are formatted, evicted and formatted again.
	for round := range 2 {
		for off := int64(0); off < 10*idBlockLen+5; off++ {
			for _, o := range []int64{off, off / 7} {
				id := ids.id(o)
				if want := fmt.Sprintf("%s-3-1-%d", prefix, o); id != want {
					t.Fatalf("round %d: offset %d named %q, want %q", round, o, id, want)
				}
				if prev, ok := seen[id]; ok && prev != o {
					t.Fatalf("offsets %d and %d share the ID %q", prev, o, id)
				}
				seen[id] = o
			}
		}
	}
	if other := newBrokerIDPrefix(); other == prefix {
		t.Errorf("two brokers share the prefix %q", prefix)
	}
}

// The default clock reads time.Now once per ClockResolution while it is
// read, lets its goroutine go when nobody reads it for a tick, starts again
// on the next read, and is time.Now after stop. In a synctest bubble time
// is virtual, so every reading is checked exactly.
func TestCoarseClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCoarseClock()
		start := time.Now()
		at := func(d time.Duration) time.Time { return start.Add(d) }
		check := func(what string, want time.Time) {
			t.Helper()
			if got := c.Now(); !got.Equal(want) {
				t.Fatalf("%s: read %v, want %v", what, got.Sub(start), want.Sub(start))
			}
		}
		const res = ClockResolution
		check("first read", at(0))
		time.Sleep(res / 2) // virtual time, in the bubble, as every Sleep here
		check("within the first tick", at(0))
		time.Sleep(res)
		check("after a refresh", at(res))
		time.Sleep(2 * res) // the tick at 2res refreshes; the one at 3res finds it unread
		synctest.Wait()
		if c.reading.Load() != nil {
			t.Fatal("the clock still refreshes after a tick nobody read it")
		}
		check("first read after idling", at(3*res+res/2))
		time.Sleep(res / 4)
		check("within a tick again", at(3*res+res/2))
		c.stop()
		check("after stop", at(3*res+3*res/4))
		time.Sleep(res)
		check("after stop, a tick later", at(4*res+3*res/4))
	})
}

// fill names a run of consecutive records as id names each of them, across
// block boundaries.
func TestRecordIDsFillMatchesID(t *testing.T) {
	r := newRecordIDs("p", 1, 0, 256)
	for _, tc := range []struct {
		first int64
		n     int
	}{{0, 1}, {0, 64}, {5, 64}, {63, 2}, {60, 200}, {1000, 7}} {
		got := make([]string, tc.n)
		r.fill(tc.first, got)
		for i, id := range got {
			if want := r.id(tc.first + int64(i)); id != want {
				t.Errorf("fill(%d, %d)[%d]: got %q, want %q", tc.first, tc.n, i, id, want)
			}
		}
	}
}
