package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// stuckHandler is a handler that holds its first delivery until release is
// closed.
func stuckHandler(release <-chan struct{}) Handler {
	return func(context.Context, *Record, int) error {
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
		orders := mustTopic(t, b, "orders", TopicConfig{Retention: Retention{MaxMessages: 2, BlockTimeout: time.Second}})
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
		want := `topic "orders" partition 0: group "a" holds the oldest record, offset 0 (as does 1 other group); full at 2 records (MaxMessages) for 1s`
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
		topic := mustTopic(t, b, "t", TopicConfig{Retention: Retention{MaxMessages: 64, BlockTimeout: time.Hour}})
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
		subscribe(t, b, "t", "late", "l1", func(_ context.Context, rec *Record, _ int) error {
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

// TestTopicConfigResolveLimits: the shapes at the limits are accepted, one
// past them is ErrInvalid naming the limit, and so are absurd ones whose
// product would overflow. resolve allocates nothing, so the shapes at the
// limits are checked here rather than created.
func TestTopicConfigResolveLimits(t *testing.T) {
	shift := 40 // a variable, so the constant 1<<40 needs no 64-bit int to compile
	for _, tc := range []struct {
		name      string
		cfg       TopicConfig
		wantLimit string // "" for valid
	}{
		{"most partitions", TopicConfig{Partitions: MaxPartitions, Retention: Retention{MaxMessages: MaxTopicMessages / MaxPartitions}}, ""},
		{"largest partition", TopicConfig{Partitions: 1, Retention: Retention{MaxMessages: MaxTopicMessages}}, ""},
		{"default records, many partitions", TopicConfig{Partitions: MaxTopicMessages / DefaultMaxMessages}, ""},
		{"one partition too many", TopicConfig{Partitions: MaxPartitions + 1, Retention: Retention{MaxMessages: 1}}, "(MaxPartitions)"},
		{"a million partitions", TopicConfig{Partitions: 1_000_000}, "over the limit of 65536 (MaxPartitions)"},
		{"one record too many", TopicConfig{Partitions: 1, Retention: Retention{MaxMessages: MaxTopicMessages + 1}}, "(MaxTopicMessages)"},
		{"one slot too many", TopicConfig{Partitions: MaxPartitions, Retention: Retention{MaxMessages: MaxTopicMessages/MaxPartitions + 1}}, "(MaxTopicMessages)"},
		{"default records, too many partitions", TopicConfig{Partitions: MaxTopicMessages/DefaultMaxMessages + 1}, "over the limit of 16777216 (MaxTopicMessages)"},
		{"MaxMessages 1<<40", TopicConfig{Retention: Retention{MaxMessages: 1 << shift}}, "over the limit of 16777216 records a topic may hold (MaxTopicMessages)"},
		{"MaxMessages MaxInt", TopicConfig{Partitions: MaxPartitions, Retention: Retention{MaxMessages: math.MaxInt}}, "(MaxTopicMessages)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.resolve("t")
			switch {
			case tc.wantLimit == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tc.wantLimit != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), tc.wantLimit)):
				t.Errorf("got %v, want ErrInvalid naming %s", err, tc.wantLimit)
			}
		})
	}
}
