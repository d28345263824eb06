package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// A batch lands exactly as the same records published one by one would:
// routed by key, in batch order within each partition, with its headers,
// and every record stamped with the one instant the batch was published.
func TestPublishBatchRoutesAndOrdersLikePublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := pubsubtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock))
		batched := mustTopic(t, b, "batched", codec.String(), codec.Int[int](), pubsub.WithPartitions(3))
		single := mustTopic(t, b, "single", codec.String(), codec.Int[int](), pubsub.WithPartitions(3))
		rec := pubsubtest.NewRecorder[int]()
		mustSubscribe(t, batched, "g", "c", rec)

		var entries []pubsub.Entry[string, int]
		var want []pubsub.Position
		for i := range 200 { // more than a slab of records
			key := fmt.Sprintf("k%d", i%7)
			entries = append(entries, pubsub.Entry[string, int]{Key: key, Value: i, Headers: map[string]string{"i": fmt.Sprint(i)}})
			want = append(want, mustPublish(t, single, key, i))
		}
		positions, err := batched.PublishBatch(context.Background(), entries)
		if len(positions) != len(entries) || err != nil {
			t.Fatalf("PublishBatch: got (%d positions, %v), want (%d, nil)", len(positions), err, len(entries))
		}
		if !slices.Equal(positions, want) {
			t.Errorf("PublishBatch returned positions %v, want %v: where Publish put them one by one", positions, want)
		}
		pubsubtest.Drain(t, b)

		msgs := rec.Messages()
		if len(msgs) != len(entries) {
			t.Fatalf("got %d messages, want %d", len(msgs), len(entries))
		}
		for _, m := range msgs {
			if got := (pubsub.Position{Partition: m.Partition, Offset: m.Offset}); got != want[m.Value] {
				t.Errorf("value %d landed at %+v; published alone it landed at %+v", m.Value, got, want[m.Value])
			}
			if m.Headers["i"] != fmt.Sprint(m.Value) || string(m.Key) != entries[m.Value].Key {
				t.Errorf("value %d: key %q headers %v, want key %q and header i=%d", m.Value, m.Key, m.Headers, entries[m.Value].Key, m.Value)
			}
			if !m.Created.Equal(clock.Now()) {
				t.Errorf("value %d: Created %v, want the batch's instant %v", m.Value, m.Created, clock.Now())
			}
		}
	})
}

// PublishValues spreads keyless records round robin, like PublishValue.
func TestPublishValuesSpreadsKeylessRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "jobs", codec.String(), codec.Int[int](), pubsub.WithPartitions(4))
		rec := pubsubtest.NewRecorder[int]()
		mustSubscribe(t, topic, "g", "c", rec)
		values := make([]int, 40)
		for i := range values {
			values[i] = i
		}
		if pos, err := topic.PublishValues(context.Background(), values); len(pos) != 40 || err != nil {
			t.Fatalf("PublishValues: got (%d positions, %v), want (40, nil)", len(pos), err)
		}
		pubsubtest.Drain(t, b)
		perPartition := map[int]int{}
		for _, m := range rec.Messages() {
			if m.Key != nil {
				t.Errorf("value %d: Key %q, want nil for a keyless record", m.Value, m.Key)
			}
			if m.Partition != m.Value%4 {
				t.Errorf("value %d went to partition %d, want %d (round robin)", m.Value, m.Partition, m.Value%4)
			}
			perPartition[m.Partition]++
		}
		for p := range 4 {
			if perPartition[p] != 10 {
				t.Errorf("partition %d got %d records, want 10", p, perPartition[p])
			}
		}
	})
}

// A value the codec cannot encode fails the whole batch before anything is
// published: the error names the entry and wraps the codec's error.
func TestPublishBatchEncodeErrorPublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.JSON[any](), pubsub.WithPartitions(2))
		entries := []pubsub.Entry[string, any]{{Key: "a", Value: 1}, {Key: "b", Value: func() {}}, {Key: "c", Value: 3}}
		pos, err := topic.PublishBatch(context.Background(), entries)
		wantNothingPublished(t, "PublishBatch with an unencodable entry", topic, pos, err, codec.ErrEncode)
		pos, err = topic.PublishValues(context.Background(), []any{1, make(chan int)})
		wantNothingPublished(t, "PublishValues with an unencodable value", topic, pos, err, codec.ErrEncode)
	})
}

// A batch bigger than the partition waits for room as the group commits,
// however many times that takes, and loses nothing.
func TestPublishBatchWaitsForRoomAsOftenAsNeeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int](),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, BlockTimeout: time.Second}))
		rec := pubsubtest.NewRecorder[int]()
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(ctx context.Context, m pubsub.Message[int]) error {
			time.Sleep(100 * time.Millisecond) // virtual: a slow consumer
			return rec.Handle(ctx, m)
		}))
		values := make([]int, 50)
		for i := range values {
			values[i] = i
		}
		start := time.Now()
		if pos, err := topic.PublishValues(context.Background(), values); len(pos) != 50 || err != nil {
			t.Fatalf("PublishValues: got (%d positions, %v), want (50, nil)", len(pos), err)
		}
		// The whole batch took longer than one BlockTimeout: each record
		// waits at most BlockTimeout, not the batch.
		if took := time.Since(start); took <= time.Second {
			t.Errorf("the batch took %v; a consumer at 100ms a record needs more than 1s for it", took)
		}
		pubsubtest.Drain(t, b)
		if got := rec.Values(); len(got) != 50 {
			t.Fatalf("got %d values, want 50", len(got))
		}
		for i, v := range rec.Values() {
			if v != i {
				t.Fatalf("value #%d is %d, want %d: the batch's order", i, v, i)
			}
		}
		if st := topic.Stats(); st.Blocked != 1 || st.TimedOut != 0 {
			t.Errorf("Stats: Blocked %d TimedOut %d, want 1 call that waited and none that timed out", st.Blocked, st.TimedOut)
		}
	})
}

// When no room appears for BlockTimeout the batch stops with
// ErrBackpressure and says how many records it published: exactly those
// are in the log, and the rest can be published again.
func TestPublishBatchBackpressureReportsWhatWasPublished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int](),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 3, BlockTimeout: time.Second}))
		release := make(chan struct{})
		var mu sync.Mutex
		var got []int
		g := mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(_ context.Context, m pubsub.Message[int]) error {
			<-release // stuck until the test lets go: no room appears
			mu.Lock()
			defer mu.Unlock()
			got = append(got, m.Value)
			return nil
		}))
		pos, err := topic.PublishValues(context.Background(), []int{0, 1, 2, 3, 4})
		if len(pos) != 3 || !errors.Is(err, pubsub.ErrBackpressure) {
			t.Fatalf("PublishValues into 3 slots: got (%d positions, %v), want (3, an error wrapping ErrBackpressure)", len(pos), err)
		}
		for i, p := range pos {
			if p != (pubsub.Position{Partition: 0, Offset: int64(i)}) {
				t.Errorf("position %d is %+v, want offset %d", i, p, i)
			}
		}
		if st := topic.Stats(); st.Published != 3 || st.TimedOut != 1 {
			t.Errorf("Stats: Published %d TimedOut %d, want 3 and 1", st.Published, st.TimedOut)
		}
		close(release)
		if pos, err := topic.PublishValues(context.Background(), []int{3, 4}); len(pos) != 2 || err != nil {
			t.Fatalf("publishing the rest: got (%d positions, %v), want (2, nil)", len(pos), err)
		}
		pubsubtest.Drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(got) != "[0 1 2 3 4]" {
			t.Errorf("delivered %v, want [0 1 2 3 4]", got)
		}
		if lag := g.Lag(); lag != 0 {
			t.Errorf("Lag %d after Drain, want 0", lag)
		}
	})
}

// A context that ends while the batch waits for room stops it with the
// context's error and the count of what made it.
func TestPublishBatchStopsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int](),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: time.Hour}))
		release := make(chan struct{})
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(context.Context, pubsub.Message[int]) error {
			<-release
			return nil
		}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pos, err := topic.PublishValues(ctx, []int{0, 1, 2})
		if len(pos) != 2 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("PublishValues: got (%d positions, %v), want (2, an error wrapping context.DeadlineExceeded)", len(pos), err)
		}
		close(release)
	})
}

// Under DropOldest a batch bigger than the partition sheds its own oldest
// records and counts them.
func TestPublishBatchDropOldestCountsWhatItSheds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int](),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 5, OnFull: pubsub.DropOldest}))
		values := make([]int, 12)
		if pos, err := topic.PublishValues(context.Background(), values); len(pos) != 12 || err != nil {
			t.Fatalf("PublishValues: got (%d positions, %v), want (12, nil)", len(pos), err)
		}
		if st := topic.Stats(); st.Published != 12 || st.Retained != 5 || st.Dropped != 7 {
			t.Errorf("Stats: Published %d Retained %d Dropped %d, want 12, 5 and 7", st.Published, st.Retained, st.Dropped)
		}
	})
}

// A partitioner that picks no valid partition for some entry fails the
// batch with ErrInvalid before anything is appended.
func TestPublishBatchBadPartitionerPublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int](), pubsub.WithPartitions(2), pubsub.WithPartitioner(badKeyPartitioner{}))
		pos, err := topic.PublishBatch(context.Background(), []pubsub.Entry[string, int]{{Key: "ok"}, {Key: "bad"}})
		wantNothingPublished(t, "PublishBatch with a bad partition", topic, pos, err, pubsub.ErrInvalid)
	})
}

// After Close began, a batch fails with ErrClosed and publishes nothing; an
// empty batch publishes nothing and succeeds.
func TestPublishBatchAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "t", codec.String(), codec.Int[int]())
		if pos, err := topic.PublishValues(context.Background(), nil); len(pos) != 0 || err != nil {
			t.Fatalf("an empty batch: got (%d positions, %v), want (0, nil)", len(pos), err)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		pos, err := topic.PublishBatch(context.Background(), []pubsub.Entry[string, int]{{Key: "k", Value: 1}})
		wantNothingPublished(t, "PublishBatch after Close", topic, pos, err, pubsub.ErrClosed)
	})
}

// badKeyPartitioner sends the key "bad" to a partition that does not exist,
// every other record to partition 0.
type badKeyPartitioner struct{}

func (badKeyPartitioner) Partition(key []byte, partitions int) int {
	if string(key) == "bad" {
		return partitions
	}
	return 0
}

// wantNothingPublished checks that a batch failed with an error wrapping
// target and left the topic as it was.
func wantNothingPublished[K, V any](t *testing.T, what string, topic *pubsub.Topic[K, V], pos []pubsub.Position, err, target error) {
	t.Helper()
	if len(pos) != 0 || !errors.Is(err, target) {
		t.Fatalf("%s: got (%d positions, %v), want (0, an error wrapping %v)", what, len(pos), err, target)
	}
	if got := topic.Stats().Published; got != 0 {
		t.Errorf("%s: %d records were published, want 0", what, got)
	}
}
