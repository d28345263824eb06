package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// stuckHandler holds its first delivery until release is closed: a group
// that commits nothing meanwhile.
func stuckHandler(release <-chan struct{}) pubsub.HandlerFunc[string] {
	return func(context.Context, pubsub.Message[string]) error {
		<-release
		return nil
	}
}

// ErrBackpressure names the group holding the oldest record. Regression:
// the error said only that the partition was full, so when one abandoned
// consumer froze a topic, nothing said which. Here "fast" commits
// everything and "stuck" holds j1; "fast" subscribed first, so naming the
// first group rather than the slowest would name the wrong one.
func TestErrBackpressureNamesTheStuckGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "jobs",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: 10 * time.Millisecond}))
		var fast recorder[string]
		mustSubscribe(t, topic, "fast", "f1", &fast)
		release := make(chan struct{})
		mustSubscribe(t, topic, "stuck", "s1", stuckHandler(release))
		mustPublishValue(t, topic, "j1")
		mustPublishValue(t, topic, "j2")
		synctest.Wait() // fast committed both; stuck is in its handler for j1

		_, err := topic.PublishValue(context.Background(), "j3")
		wantErrIs(t, "PublishValue to a partition stuck holds", err, pubsub.ErrBackpressure)
		if msg := err.Error(); !strings.Contains(msg, `group "stuck"`) || strings.Contains(msg, `"fast"`) {
			t.Errorf("error %q: want it to name group \"stuck\", and not \"fast\"", msg)
		}
		close(release)
		pubsubtest.Drain(t, b)
	})
}

// A topic with no group never fails publishers and keeps the newest
// records. Regression: a partition with no group freed nothing, so under
// Block publish number 1025 waited BlockTimeout and failed with
// ErrBackpressure, though nobody could ever make room. Now a full partition
// that no group reads trims its oldest record (counted in Dropped), and a
// group that comes late reads the newest 1024.
func TestATopicWithNoGroupNeverFailsPublishersAndKeepsTheNewestRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "events", codec.String(), codec.Int[int](),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1024, OnFull: pubsub.Block, BlockTimeout: time.Second}))
		start := time.Now()
		for i := range 3000 {
			if _, err := topic.PublishValue(context.Background(), i); err != nil {
				t.Fatalf("PublishValue(%d): got %v, want nil", i, err)
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the publishes took %v of virtual time, want 0: nothing should wait", waited)
		}
		st := topic.Stats()
		if st.Published != 3000 || st.Retained != 1024 || st.Dropped != 1976 || st.Blocked != 0 || st.TimedOut != 0 {
			t.Errorf("stats: got %+v, want Published 3000, Retained 1024, Dropped 1976, none Blocked or TimedOut", st)
		}
		if earliest, end, _ := topic.Offsets(0); earliest != 1976 || end != 3000 {
			t.Errorf("Offsets(0): got [%d, %d), want [1976, 3000)", earliest, end)
		}

		var late recorder[int]
		g := mustSubscribe(t, topic, "late", "l1", &late)
		pubsubtest.Drain(t, b)
		var offsets []int64
		for _, m := range late.calls() {
			offsets = append(offsets, m.Offset)
			if int64(m.Value) != m.Offset {
				t.Fatalf("offset %d carries value %d", m.Offset, m.Value)
			}
		}
		want := make([]int64, 0, 1024)
		for o := int64(1976); o < 3000; o++ {
			want = append(want, o)
		}
		if !slices.Equal(offsets, want) {
			t.Errorf("the late group read %s; want offsets 1976..2999 in order", span(offsets))
		}
		if s := g.Stats(); s.Skipped != 0 {
			t.Errorf("the late group skipped %d, want 0: what was trimmed before it existed is not its loss", s.Skipped)
		}

		// With a group, Block waits for it again: no more trimming.
		release := make(chan struct{})
		mustSubscribe(t, topic, "stuck", "s1", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error {
			<-release
			return nil
		}))
		_, err := topic.PublishValue(context.Background(), 3000)
		wantErrIs(t, "PublishValue with a group holding the oldest record", err, pubsub.ErrBackpressure)
		if st := topic.Stats(); st.Dropped != 1976 {
			t.Errorf("Dropped: got %d, want still 1976", st.Dropped)
		}
		close(release)
		pubsubtest.Drain(t, b)
	})
}

// span describes offsets briefly for a failure message.
func span(offsets []int64) string {
	if len(offsets) == 0 {
		return "no records"
	}
	return fmt.Sprintf("%d records, offsets %d..%d", len(offsets), offsets[0], offsets[len(offsets)-1])
}

// Absurd topic shapes are ErrInvalid at once, naming the limit, and
// allocate nothing on the way. Regression: WithPartitions(1_000_000) did not
// return in 20 s, since each partition allocated its ring and bookkeeping
// first, and MaxMessages 1<<40 asked make for 8 TiB.
func TestAbsurdTopicShapesAreErrInvalidAtOnceNamingTheLimit(t *testing.T) {
	shift := 40 // a variable, so the constant 1<<40 needs no 64-bit int to compile
	for _, tc := range []struct {
		name  string
		opts  []pubsub.TopicOption
		limit string
	}{
		{"a million partitions", []pubsub.TopicOption{pubsub.WithPartitions(1_000_000)}, "limit of 65536 (MaxPartitions)"},
		{"MaxMessages 1<<40", []pubsub.TopicOption{pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << shift})}, "limit of 16777216 records a topic may hold (MaxTopicMessages)"},
		{"MaxMessages MaxInt", []pubsub.TopicOption{pubsub.WithRetention(pubsub.Retention{MaxMessages: math.MaxInt})}, "(MaxTopicMessages)"},
		{"MaxPartitions of the default 1024", []pubsub.TopicOption{pubsub.WithPartitions(pubsub.MaxPartitions)}, "65536 partitions × MaxMessages 1024 = 67108864 records, over the limit of 16777216 (MaxTopicMessages)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := pubsub.NewBroker()
			defer b.Close(context.Background())
			// Bytes rather than allocations: other tests' goroutines finishing
			// in the background allocate a little too, while the shapes
			// refused here would each allocate hundreds of MiB before
			// failing if the check came late.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), tc.opts...)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, pubsub.ErrInvalid) || !strings.Contains(err.Error(), tc.limit) {
				t.Errorf("NewTopic: got %v, want ErrInvalid naming %q", err, tc.limit)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("NewTopic allocated %d bytes on the way to its error, want a few: the check must come first", n)
			}
		})
	}
}

// MaxBytes bounds the key and value bytes each partition retains, as each
// policy says: Block waits for the group holding the oldest record, then
// fails; DropOldest drops as many of the oldest records as the new one
// needs; a partition no group reads trims them whatever the policy. Every
// record here is 4 bytes ("k" + a 3-byte value), so MaxBytes 10 holds two.
func TestMaxBytesBlocksDropsAndTrimsAsEachPolicySays(t *testing.T) {
	for _, tc := range []struct {
		name      string
		onFull    pubsub.FullPolicy
		group     bool // a group that holds the first record and commits nothing
		wantErr   error
		wantStats pubsub.TopicStats
	}{
		{"Block with a group waits, then fails", pubsub.Block, true, pubsub.ErrBackpressure,
			pubsub.TopicStats{Published: 2, Retained: 2, RetainedBytes: 8, Blocked: 1, TimedOut: 1}},
		{"DropOldest drops", pubsub.DropOldest, true, nil,
			pubsub.TopicStats{Published: 3, Retained: 2, RetainedBytes: 8, Dropped: 1}},
		{"Block without a group trims", pubsub.Block, false, nil,
			pubsub.TopicStats{Published: 3, Retained: 2, RetainedBytes: 8, Dropped: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "t",
					pubsub.WithRetention(pubsub.Retention{MaxBytes: 10, OnFull: tc.onFull, BlockTimeout: time.Second}))
				release := make(chan struct{})
				if tc.group {
					mustSubscribe(t, topic, "g", "c", stuckHandler(release))
				}
				mustPublish(t, topic, "k", "one")
				mustPublish(t, topic, "k", "two")
				start := time.Now()
				_, err := topic.Publish(context.Background(), "k", "six")
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("third Publish: got %v, want %v", err, tc.wantErr)
				}
				wantWait := time.Duration(0)
				if tc.wantErr != nil {
					wantWait = time.Second
				}
				if waited := time.Since(start); waited != wantWait {
					t.Errorf("third Publish waited %v, want %v", waited, wantWait)
				}
				if got := topic.Stats(); got != tc.wantStats {
					t.Errorf("stats: got %+v, want %+v", got, tc.wantStats)
				}
				close(release)
				pubsubtest.Drain(t, b)
			})
		})
	}
}

// A record whose key and value alone exceed MaxBytes could never fit: its
// Publish fails at once with ErrInvalid naming the sizes, a batch holding
// one publishes nothing, and what was retained stays.
func TestAnOversizeRecordIsErrInvalidAndAppendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, topic := newTopic(t, "t",
			pubsub.WithRetention(pubsub.Retention{MaxBytes: 8, OnFull: pubsub.DropOldest}))
		mustPublish(t, topic, "k", "ok")
		before := topic.Stats()

		_, err := topic.Publish(context.Background(), "key", "too long")
		wantErrIs(t, "Publish of 11 bytes into MaxBytes 8", err, pubsub.ErrInvalid)
		if err != nil && !strings.Contains(err.Error(), "a record of 11 bytes (key 3 + value 8) can never fit in MaxBytes 8") {
			t.Errorf("error %q: want it to name the sizes", err)
		}
		pos, err := topic.PublishBatch(context.Background(), []pubsub.Entry[string, string]{
			{Key: "k", Value: "a"}, {Key: "k", Value: "b"}, {Key: "key", Value: "too long"},
		})
		wantErrIs(t, "PublishBatch with an oversize entry", err, pubsub.ErrInvalid)
		if len(pos) != 0 {
			t.Errorf("PublishBatch: got %d positions, want none", len(pos))
		}
		if got := topic.Stats(); got != before {
			t.Errorf("stats: got %+v, want them unchanged, %+v", got, before)
		}
	})
}

// A negative MaxBytes is ErrInvalid, like the other negative bounds.
func TestNegativeMaxBytesIsErrInvalid(t *testing.T) {
	b := pubsubtest.NewBroker(t)
	_, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithRetention(pubsub.Retention{MaxBytes: -1}))
	wantErrIs(t, "NewTopic with MaxBytes -1", err, pubsub.ErrInvalid)
}

// liveHeap returns the bytes of live heap objects, after collecting garbage
// twice (the second empties sync.Pool's victim cache).
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// partitionHeap returns the live heap each partition of a new, empty topic
// of 4096 partitions of maxMessages takes.
func partitionHeap(t *testing.T, maxMessages int) float64 {
	t.Helper()
	const partitions = 4096
	b := pubsub.NewBroker()
	defer b.Close(context.Background())
	before := liveHeap()
	topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.Bytes(),
		pubsub.WithPartitions(partitions), pubsub.WithRetention(pubsub.Retention{MaxMessages: maxMessages}))
	if err != nil {
		t.Fatal(err)
	}
	after := liveHeap()
	runtime.KeepAlive(topic)
	return float64(after-before) / partitions
}

// recordHeap returns the live heap each of n retained records takes beyond
// its 16-byte key and 64-byte value (sizes of allocator classes, so that
// they take no more than they hold), with or without a group that has
// delivered them all (a delivery formats the records' IDs, which the
// partition keeps for its groups to share).
func recordHeap(t *testing.T, n int, group bool) float64 {
	t.Helper()
	b := pubsub.NewBroker()
	defer b.Close(context.Background())
	topic, err := pubsub.NewTopic(b, "t", codec.String(), codec.Bytes(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: n}))
	if err != nil {
		t.Fatal(err)
	}
	if group {
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error { return nil }))
	}
	before := liveHeap()
	for i := range n {
		mustPublish(t, topic, fmt.Sprintf("key-%012d", i), make([]byte, 64))
	}
	pubsubtest.Drain(t, b)
	after := liveHeap()
	if st := topic.Stats(); st.Retained != n || st.RetainedBytes != int64(n*(16+64)) {
		t.Fatalf("stats %+v: want %d records of 80 bytes retained", st, n)
	}
	return float64(after-before)/float64(n) - (16 + 64)
}

// The memory costs Retention's doc states, measured. Keep them in sync:
// this test fails when a measurement strays from the doc by more than a
// tenth, and logs what it measured.
func TestRetentionDocStatesTheMemoryCost(t *testing.T) {
	if strconv.IntSize != 64 {
		t.Skip("the doc's numbers are for 64-bit platforms")
	}
	const ( // as the doc says, in bytes
		docPartition        = 680   // a partition of MaxMessages 1
		docDefaultPartition = 10272 // a partition of the default 1024 (10.0 KiB)
		docRecord           = 112   // a retained record beyond its key and value
		docDelivered        = 25    // more per record once a group delivered it
	)
	partition, defaultPartition := partitionHeap(t, 1), partitionHeap(t, 0)
	record := recordHeap(t, 1<<14, false)
	delivered := recordHeap(t, 1<<14, true) - record
	t.Logf("measured: %.0f B per partition of 1 record, %.0f B of 1024; %.1f B per record beyond key and value, %.1f B more once delivered",
		partition, defaultPartition, record, delivered)
	for _, m := range []struct {
		what      string
		got, want float64
	}{
		{"partition of 1", partition, docPartition},
		{"partition of 1024", defaultPartition, docDefaultPartition},
		{"record", record, docRecord},
		{"delivered record", delivered, docDelivered},
	} {
		if m.got < m.want*0.9 || m.got > m.want*1.1 {
			t.Errorf("%s: measured %.1f bytes, Retention's doc says %d: update the doc", m.what, m.got, int(m.want))
		}
	}
}
