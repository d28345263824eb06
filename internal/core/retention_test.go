package core

import (
	"context"
	"errors"
	"fmt"
	"github.com/logbus/logbus/engine"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// stuckHandler is a handler that holds its first delivery until release is
// closed.
func stuckHandler(release <-chan struct{}) Handler {
	return func(context.Context, *Delivery) error {
		<-release
		return nil
	}
}

// TestBackpressureErrorNamesTheLowestCursor: of three groups, "done"
// committed both records and "a" and "b" hold the first. The error names
// the first of the lowest ("a"), counts the one tied with it, and leaves
// out the group that is not holding anything.
func TestBackpressureErrorNamesTheLowestCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 2, BlockTimeout: time.Second}})
		release := make(chan struct{})
		var done recorder
		subscribe(t, b, "orders", "done", "d1", done.handler("d1"))
		subscribe(t, b, "orders", "a", "a1", stuckHandler(release))
		subscribe(t, b, "orders", "b", "b1", stuckHandler(release))
		publish(t, orders, "", "one")
		publish(t, orders, "", "two")
		synctest.Wait()

		_, err := orders.Publish(context.Background(), nil, []byte("three"), nil)
		wantErr(t, err, ErrBackpressure)
		want := `partition 0: group "a" holds the oldest record, offset 0 (as does 1 other group); full at 2 records (MaxMessages) for 1s`
		if !strings.HasSuffix(err.Error(), want) {
			t.Errorf("error %q: want it to end %q", err, want)
		}
		close(release)
		drain(t, b)
	})
}

// TestAGrouplessPartitionTrimsUnderBlockAndALateGroupReadsWhatFollows: a
// full partition that no group reads trims its oldest record under Block
// (counted in Dropped) instead of making a producer wait, and the trimmed
// records are reused for new ones. A group that subscribes while producers
// race to publish starts at the oldest record then retained and reads every
// record from there intact, in offset order: the records it can see are
// never trimmed and reused under it. Run it with -race: the slots of a
// partition that only reclaims are plain (see ring).
func TestAGrouplessPartitionTrimsUnderBlockAndALateGroupReadsWhatFollows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 64, BlockTimeout: time.Hour}})
		const producers, each = 4, 500
		var (
			mu      sync.Mutex
			byOff   = map[int64]string{} // what each offset was published with
			got     []*Record            // copies of what the late group read
			started = make(chan struct{})
			wg      sync.WaitGroup
		)
		start := time.Now()
		for p := range producers {
			wg.Go(func() {
				for i := range each {
					if i == each/2 && p == 0 {
						close(started) // the group subscribes while the others go on
					}
					v := fmt.Sprintf("p%d-%d", p, i)
					pos, err := topic.Publish(context.Background(), nil, []byte(v), nil)
					if err != nil {
						t.Errorf("Publish(%s): %v", v, err)
						return
					}
					mu.Lock()
					byOff[pos.Offset] = v
					mu.Unlock()
				}
			})
		}
		<-started
		subscribe(t, b, "t", "late", "l1", func(_ context.Context, d *Delivery) error {
			rec := d.Record
			kept := *rec
			kept.Value = append([]byte(nil), rec.Value...)
			mu.Lock()
			got = append(got, &kept)
			mu.Unlock()
			return nil
		})
		wg.Wait()
		drain(t, b)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("producers waited %v of virtual time, want 0: none waited out its timeout", waited)
		}
		// Once the group is there, producers may wait for it (Blocked), but
		// only until it commits.
		s := topic.Partition(0).Stats()
		if s.End != producers*each || s.Earliest != s.Reclaimed+s.Dropped+s.Expired || s.Dropped == 0 || s.TimedOut != 0 {
			t.Errorf("stats %+v: want %d published, some dropped, none timed out, Earliest == Reclaimed+Dropped+Expired", s, producers*each)
		}
		if len(got) == 0 {
			t.Fatal("the late group read nothing")
		}
		first := got[0].Offset
		for i, rec := range got {
			if rec.Offset != first+int64(i) {
				t.Fatalf("the late group read offset %d at position %d, want %d: not dense from %d", rec.Offset, i, first+int64(i), first)
			}
			if want := byOff[rec.Offset]; string(rec.Value) != want {
				t.Fatalf("offset %d reads %q, was published as %q", rec.Offset, rec.Value, want)
			}
		}
		if last := got[len(got)-1].Offset; last != producers*each-1 {
			t.Errorf("the late group read up to offset %d, want %d", last, producers*each-1)
		}
	})
}

// TestTopicSpecResolveLimits: the shapes at the limits are accepted, one
// past them is ErrInvalid naming the limit, and so are absurd ones whose
// product would overflow. resolve allocates nothing, so the shapes at the
// limits are checked here rather than created.
func TestTopicSpecResolveLimits(t *testing.T) {
	shift := 40 // a variable, so the constant 1<<40 needs no 64-bit int to compile
	for _, tc := range []struct {
		name      string
		cfg       TopicSpec
		wantLimit string // "" for valid
	}{
		{"most partitions", TopicSpec{Partitions: MaxPartitions, Retention: Retention{MaxMessages: MaxTopicMessages / MaxPartitions}}, ""},
		{"largest partition", TopicSpec{Partitions: 1, Retention: Retention{MaxMessages: MaxTopicMessages}}, ""},
		{"default records, many partitions", TopicSpec{Partitions: MaxTopicMessages / engine.DefaultMaxMessages}, ""},
		{"one partition too many", TopicSpec{Partitions: MaxPartitions + 1, Retention: Retention{MaxMessages: 1}}, "(MaxPartitions)"},
		{"a million partitions", TopicSpec{Partitions: 1_000_000}, "over the limit of 65536 (MaxPartitions)"},
		{"one record too many", TopicSpec{Partitions: 1, Retention: Retention{MaxMessages: MaxTopicMessages + 1}}, "(MaxTopicMessages)"},
		{"one slot too many", TopicSpec{Partitions: MaxPartitions, Retention: Retention{MaxMessages: MaxTopicMessages/MaxPartitions + 1}}, "(MaxTopicMessages)"},
		{"default records, too many partitions", TopicSpec{Partitions: MaxTopicMessages/engine.DefaultMaxMessages + 1}, "over the limit of 16777216 (MaxTopicMessages)"},
		{"MaxMessages 1<<40", TopicSpec{Retention: Retention{MaxMessages: 1 << shift}}, "over the limit of 16777216 records a topic may hold (MaxTopicMessages)"},
		{"MaxMessages MaxInt", TopicSpec{Partitions: MaxPartitions, Retention: Retention{MaxMessages: math.MaxInt}}, "(MaxTopicMessages)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.Resolve("t")
			switch {
			case tc.wantLimit == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tc.wantLimit != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), tc.wantLimit)):
				t.Errorf("got %v, want ErrInvalid naming %s", err, tc.wantLimit)
			}
		})
	}
}

// fatalfer is what the helpers below need of a *testing.T or *rapid.T.
type fatalfer interface {
	Helper()
	Fatalf(format string, args ...any)
}

// newTestPartition returns a partition with retention ret (resolved) and a
// cursor for each group named, driven by hand: no broker, no workers. A
// group commits by moving its cursor and calling notifyCommit.
func newTestPartition(t fatalfer, ret Retention, groups ...string) (*Partition, []*Cursor) {
	t.Helper()
	ret, err := ret.Resolve()
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	p := newPartition("t", 0, ret, nil, &sync.Pool{}, nil)
	cursors := make([]*Cursor, len(groups))
	for i, g := range groups {
		cursors[i] = new(Cursor)
		p.subscribe(cursors[i], g, Start{})
	}
	return p, cursors
}

// appendValue appends a keyless record of size bytes.
func appendValue(ctx context.Context, p *Partition, size int) (int64, error) {
	var off [1]int64
	_, err := p.Append(ctx, []*Record{{Value: make([]byte, size)}}, off[:])
	return off[0], err
}

// commit moves c to offset, as a worker's ack does.
func commit(p *Partition, c *Cursor, offset int64) {
	c.Commit(c.Committed(), offset)
	p.notifyCommit()
}

// retainedBytes adds up the key and value bytes of the records p retains,
// from its slots, and checks each slot holds the record of its offset.
func retainedBytes(t fatalfer, p *Partition) int64 {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum int64
	for o := p.base; o < p.next; o++ {
		rec := p.ring.load(o)
		if rec == nil || rec.Offset != o {
			t.Fatalf("slot of offset %d holds %v, want the record of offset %d", o, rec, o)
		}
		sum += recordBytes(rec)
	}
	return sum
}

// TestMaxBytesBlockWaitsForEnoughRoom: under Block, a record that needs two
// records freed waits past the commit that frees one, and lands on the
// commit that frees the second, without waiting out its timeout.
func TestMaxBytesBlockWaitsForEnoughRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, c := newTestPartition(t, Retention{MaxBytes: 10, BlockTimeout: time.Hour}, "g")
		appendValue(context.Background(), p, 4) // offset 0
		appendValue(context.Background(), p, 4) // offset 1: 8 of 10 bytes
		start := time.Now()
		done := make(chan error)
		go func() {
			_, err := appendValue(context.Background(), p, 8) // 8 more: both must go
			done <- err
		}()
		synctest.Wait()
		commit(p, c[0], 1) // frees offset 0: 4 + 8 is still over 10
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the append returned %v with 4 bytes held and 8 to store, want it to wait", err)
		default:
		}
		commit(p, c[0], 2)
		if err := <-done; err != nil {
			t.Fatalf("append after the second commit: %v", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the producer waited %v of virtual time, want 0: it must wake on the commits", waited)
		}
		s := p.Stats()
		if s.Retained != 1 || s.RetainedBytes != 8 || s.Reclaimed != 2 || s.Blocked != 1 || s.TimedOut != 0 {
			t.Errorf("stats %+v: want 1 record of 8 bytes retained, 2 reclaimed, 1 blocked, none timed out", s)
		}
	})
}

// TestMaxBytesBackpressureSaysWhichBoundIsFull: the ErrBackpressure of a
// partition full in bytes says so, with the sizes.
func TestMaxBytesBackpressureSaysWhichBoundIsFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := newTestPartition(t, Retention{MaxBytes: 10, BlockTimeout: time.Second}, "g")
		appendValue(context.Background(), p, 7)
		_, err := appendValue(context.Background(), p, 4)
		wantErr(t, err, ErrBackpressure)
		want := `group "g" holds the oldest record, offset 0; full at 7 of 10 bytes (MaxBytes) with 4 more to store for 1s`
		if !strings.HasSuffix(err.Error(), want) {
			t.Errorf("error %q: want it to end %q", err, want)
		}
	})
}

// TestMaxBytesDropOldestAndGrouplessTrimFreeAsManyAsNeeded: DropOldest
// drops, and a partition without groups trims, as many of the oldest
// records as a new one needs, and no more.
func TestMaxBytesDropOldestAndGrouplessTrimFreeAsManyAsNeeded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		onFull FullPolicy
		groups []string
	}{
		{"DropOldest, a group that reads nothing", DropOldest, []string{"g"}},
		{"Block, no group", Block, nil},
		{"DropOldest, no group", DropOldest, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newTestPartition(t, Retention{MaxBytes: 10, OnFull: tc.onFull, BlockTimeout: time.Hour}, tc.groups...)
			for range 3 {
				appendValue(context.Background(), p, 3) // 9 of 10 bytes
			}
			if _, err := appendValue(context.Background(), p, 7); err != nil { // two must go: 3 + 7 = 10
				t.Fatalf("append: %v", err)
			}
			s := p.Stats()
			if s.Earliest != 2 || s.Retained != 2 || s.RetainedBytes != 10 || s.Dropped != 2 || s.Blocked != 0 {
				t.Errorf("stats %+v: want offsets 0 and 1 dropped, 2 records of 10 bytes retained, none blocked", s)
			}
			if got := retainedBytes(t, p); got != s.RetainedBytes {
				t.Errorf("the retained records hold %d bytes, RetainedBytes says %d", got, s.RetainedBytes)
			}
			// The freed slots are emptied: they must not keep their records
			// from the garbage collector (see evictLocked).
			for o := int64(0); o < 2; o++ {
				if rec := p.ring.load(o); rec != nil && rec.Offset == o {
					t.Errorf("the slot of freed offset %d still holds its record", o)
				}
			}
		})
	}
}

// TestARecordLargerThanMaxBytesFailsAtOnceAndAppendsNothing: it could never
// fit, so it neither waits nor evicts anything, under either policy, with
// or without groups; and a batch holding one is refused whole, before
// anything is appended.
func TestARecordLargerThanMaxBytesFailsAtOnceAndAppendsNothing(t *testing.T) {
	for _, onFull := range []FullPolicy{Block, DropOldest} {
		for _, groups := range [][]string{nil, {"g"}} {
			t.Run(fmt.Sprintf("%v/groups=%d", onFull, len(groups)), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p, _ := newTestPartition(t, Retention{MaxBytes: 10, OnFull: onFull, BlockTimeout: time.Hour}, groups...)
					appendValue(context.Background(), p, 5)
					before := p.Stats()
					start := time.Now()
					var offs [3]int64
					n, err := p.Append(context.Background(), []*Record{
						{Value: []byte("ok")}, {Key: []byte("key"), Value: make([]byte, 8)}, {Value: []byte("ok")},
					}, offs[:])
					wantErr(t, err, ErrInvalid)
					if want := "a record of 11 bytes (key 3 + value 8) can never fit in MaxBytes 10"; !strings.Contains(err.Error(), want) {
						t.Errorf("error %q: want it to say %q", err, want)
					}
					if n != 0 || p.Stats() != before {
						t.Errorf("stored %d, stats %+v; want nothing stored and the stats as before, %+v", n, p.Stats(), before)
					}
					if waited := time.Since(start); waited != 0 {
						t.Errorf("the append waited %v, want it to fail at once", waited)
					}
				})
			})
		}
	}
}

// TestRetainedBytesStayWithinMaxBytes is a property: whatever is appended
// and committed, a partition never holds more than MaxBytes (nor
// MaxMessages), its RetainedBytes is the sum of what it holds, Earliest ==
// Reclaimed + Dropped + Expired, and an append frees exactly the oldest
// records it needs and fails only when it must: under Block, when even
// freeing everything every group committed would not make room.
func TestRetainedBytesStayWithinMaxBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxBytes := rapid.Int64Range(1, 40).Draw(t, "maxBytes")
		maxMessages := rapid.IntRange(1, 8).Draw(t, "maxMessages")
		onFull := rapid.SampledFrom([]FullPolicy{Block, DropOldest}).Draw(t, "onFull")
		groups := rapid.SampledFrom([][]string{nil, {"a"}, {"a", "b"}}).Draw(t, "groups")
		p, cursors := newTestPartition(t, Retention{MaxMessages: maxMessages, MaxBytes: maxBytes, OnFull: onFull}, groups...)
		// A Block append that finds no room takes the ctx.Done branch at
		// once instead of waiting: its error says it would have waited.
		wouldWait, cancel := context.WithCancel(context.Background())
		cancel()
		var sizes []int64 // by offset: what was appended

		t.Repeat(map[string]func(*rapid.T){
			"append": func(t *rapid.T) {
				size := rapid.Int64Range(0, maxBytes+2).Draw(t, "size")
				before := p.Stats()
				// Predict: free the oldest records, reclaiming below the
				// lowest cursor and, under DropOldest or without groups,
				// dropping past it, until the record fits.
				low := before.End
				for _, c := range cursors {
					low = min(low, c.Committed())
				}
				mayDrop := onFull == DropOldest || len(cursors) == 0
				base, count, held := before.Earliest, before.Retained, before.RetainedBytes
				for base < before.End && (count >= maxMessages || held+size > maxBytes) && (base < low || mayDrop) {
					held -= sizes[base]
					base++
					count--
				}
				fits := count < maxMessages && held+size <= maxBytes

				off, err := appendValue(wouldWait, p, int(size))
				after := p.Stats()
				switch {
				case size > maxBytes:
					if !errors.Is(err, ErrInvalid) || after != before {
						t.Fatalf("append of %d bytes with MaxBytes %d: got %v and stats %+v, want ErrInvalid and nothing changed (%+v)", size, maxBytes, err, after, before)
					}
				case fits:
					if err != nil || off != before.End {
						t.Fatalf("append of %d bytes: got offset %d, error %v; want offset %d", size, off, err, before.End)
					}
					if after.Earliest != base {
						t.Fatalf("append of %d bytes freed up to offset %d, want %d: only as many as it needs (stats before %+v)", size, after.Earliest, base, before)
					}
					sizes = append(sizes, size)
				default:
					if !errors.Is(err, context.Canceled) || after.End != before.End {
						t.Fatalf("append of %d bytes that cannot fit under Block: got %v, end %d; want it to wait, appending nothing", size, err, after.End)
					}
				}
			},
			"commit": func(t *rapid.T) {
				if len(cursors) == 0 {
					t.Skip("no group")
				}
				c := cursors[rapid.IntRange(0, len(cursors)-1).Draw(t, "group")]
				commit(p, c, rapid.Int64Range(c.Committed(), p.End()).Draw(t, "to"))
			},
			"": func(t *rapid.T) {
				s := p.Stats()
				switch {
				case s.RetainedBytes > maxBytes || s.Retained > maxMessages:
					t.Fatalf("stats %+v: over MaxBytes %d or MaxMessages %d", s, maxBytes, maxMessages)
				case s.Earliest != s.Reclaimed+s.Dropped+s.Expired:
					t.Fatalf("stats %+v: Earliest != Reclaimed + Dropped + Expired", s)
				case s.Dropped > 0 && onFull == Block && len(cursors) > 0:
					t.Fatalf("stats %+v: a Block partition with groups dropped records", s)
				}
				if got := retainedBytes(t, p); got != s.RetainedBytes {
					t.Fatalf("the retained records hold %d bytes, RetainedBytes says %d", got, s.RetainedBytes)
				}
			},
		})
	})
}
