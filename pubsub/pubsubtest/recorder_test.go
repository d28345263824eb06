package pubsubtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func msg(partition int, offset int64, value string) pubsub.Message[string] {
	return pubsub.Message[string]{Topic: "t", Partition: partition, Offset: offset, Value: value, Attempt: 1}
}

// Handlers of several partitions run at once; the Recorder must keep each
// partition's messages in offset order and each key's in publish order.
func TestRecorderRecordsInOrderPerPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const partitions, keys, rounds = 4, 8, 50
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "events", pubsub.WithPartitions(partitions))
		rec := pubsubtest.NewRecorder[string]()
		mustSubscribe(t, topic, "audit", rec)
		for i := range rounds {
			for k := range keys {
				mustPublish(t, topic, fmt.Sprintf("k%d", k), fmt.Sprintf("k%d/%d", k, i))
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := rec.WaitFor(ctx, keys*rounds); err != nil {
			t.Fatal(err)
		}

		msgs, values := rec.Messages(), rec.Values()
		if len(msgs) != keys*rounds || len(values) != keys*rounds || rec.Len() != keys*rounds || rec.Calls() != keys*rounds {
			t.Fatalf("Messages %d, Values %d, Len %d, Calls %d; want %d each",
				len(msgs), len(values), rec.Len(), rec.Calls(), keys*rounds)
		}
		nextOffset := map[int]int64{}
		nextRound := map[string]int{}
		for i, m := range msgs {
			if values[i] != m.Value {
				t.Fatalf("Values()[%d] = %q, Messages()[%d].Value = %q", i, values[i], i, m.Value)
			}
			if m.Offset != nextOffset[m.Partition] {
				t.Fatalf("partition %d: offset %d recorded after %d", m.Partition, m.Offset, nextOffset[m.Partition]-1)
			}
			nextOffset[m.Partition]++
			key, round, _ := strings.Cut(m.Value, "/")
			if want := fmt.Sprint(nextRound[key]); round != want {
				t.Fatalf("key %s: round %s recorded where %s was due", key, round, want)
			}
			nextRound[key]++
		}
		if len(nextOffset) < 2 {
			t.Fatalf("all keys landed in %d partition(s); the test needs concurrent partitions", len(nextOffset))
		}
	})
}

// WaitFor must return exactly when the n-th ack happens, not before, and
// wait durably meanwhile: synctest.Wait only returns when the waiters are
// durably blocked, so a waiter stuck on a mutex would hang this test.
func TestRecorderWaitForRendezvous(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rec pubsubtest.Recorder[string] // the zero Recorder is ready
		results := map[int]chan error{1: make(chan error, 1), 3: make(chan error, 1)}
		for n, res := range results {
			go func() { res <- rec.WaitFor(t.Context(), n) }()
		}
		done := func(n int) bool {
			select {
			case err := <-results[n]:
				if err != nil {
					t.Fatalf("WaitFor(%d): %v", n, err)
				}
				return true
			default:
				return false
			}
		}

		synctest.Wait()
		if done(1) || done(3) {
			t.Fatal("WaitFor returned before any ack")
		}
		for i := range 2 {
			if err := rec.Handle(t.Context(), msg(0, int64(i), "v")); err != nil {
				t.Fatalf("Handle: %v", err)
			}
		}
		synctest.Wait()
		if !done(1) {
			t.Fatal("WaitFor(1) still waiting after 2 acks")
		}
		if done(3) {
			t.Fatal("WaitFor(3) returned after 2 acks")
		}
		rec.Handle(t.Context(), msg(0, 2, "v"))
		synctest.Wait()
		if !done(3) {
			t.Fatal("WaitFor(3) still waiting after 3 acks")
		}
	})
}

func TestRecorderWaitForReturnsContextError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := pubsubtest.NewRecorder[string]()
		rec.Handle(t.Context(), msg(0, 0, "only"))

		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		err := rec.WaitFor(ctx, 2)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitFor(2) with 1 ack = %v, want context.DeadlineExceeded", err)
		}
		if !strings.Contains(err.Error(), "have 1") {
			t.Errorf("error %q does not say how many were acked", err)
		}
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("WaitFor gave up after %v of virtual time, want the 5s timeout", got)
		}

		cancelled, cancelNow := context.WithCancel(t.Context())
		cancelNow()
		if err := rec.WaitFor(cancelled, 2); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitFor on a cancelled context = %v, want context.Canceled", err)
		}
	})
}

// A count already reached wins over a context already done.
func TestRecorderWaitForReachedIgnoresContext(t *testing.T) {
	rec := pubsubtest.NewRecorder[int]()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rec.WaitFor(ctx, 0); err != nil {
		t.Fatalf("WaitFor(0) = %v, want nil", err)
	}
	rec.Handle(ctx, pubsub.Message[int]{Value: 7})
	if err := rec.WaitFor(ctx, 1); err != nil {
		t.Fatalf("WaitFor(1) after one ack = %v, want nil", err)
	}
}

func TestRecorderFailWith(t *testing.T) {
	rec := pubsubtest.NewRecorder[string]()
	boom := errors.New("boom")
	rec.FailWith(func(m pubsub.Message[string]) error {
		if m.Value == "bad" {
			return boom
		}
		return nil
	})
	if err := rec.Handle(t.Context(), msg(0, 0, "bad")); !errors.Is(err, boom) {
		t.Fatalf("Handle(bad) = %v, want the injected error", err)
	}
	if err := rec.Handle(t.Context(), msg(0, 0, "good")); err != nil {
		t.Fatalf("Handle(good) = %v, want nil", err)
	}
	if rec.Calls() != 2 || rec.Len() != 1 || !slices.Equal(rec.Values(), []string{"good"}) {
		t.Fatalf("Calls %d Len %d Values %q; want 2, 1, [good]", rec.Calls(), rec.Len(), rec.Values())
	}
	rec.FailWith(nil)
	if err := rec.Handle(t.Context(), msg(0, 1, "bad")); err != nil {
		t.Fatalf("Handle(bad) after FailWith(nil) = %v, want nil", err)
	}
	if rec.Calls() != 3 || !slices.Equal(rec.Values(), []string{"good", "bad"}) {
		t.Fatalf("Calls %d Values %q; want 3, [good bad]", rec.Calls(), rec.Values())
	}
}

// A failure the Recorder injects goes through the broker's retries: the
// failed attempts are counted in Calls but not recorded, the partition
// waits (virtual) backoff and keeps its order, and the ack carries the
// attempt number.
func TestRecorderFailureInjectionRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{
			MaxAttempts: 3, BaseDelay: 10 * time.Millisecond, Multiplier: 2,
		}))
		topic := mustTopic(t, b, "orders")
		rec := pubsubtest.NewRecorder[string]()
		rec.FailWith(func(m pubsub.Message[string]) error {
			if m.Value == "flaky" && m.Attempt < 3 {
				return errors.New("warehouse busy")
			}
			return nil
		})
		g := mustSubscribe(t, topic, "shipping", rec)

		start := time.Now()
		for _, v := range []string{"ok1", "flaky", "ok2"} {
			mustPublish(t, topic, "k", v)
		}
		pubsubtest.Drain(t, b)

		if got := time.Since(start); got != 30*time.Millisecond {
			t.Errorf("drained after %v of virtual time, want 10ms + 20ms of backoff", got)
		}
		if rec.Calls() != 5 || rec.Len() != 3 {
			t.Fatalf("Calls %d Len %d; want 5 (two failed attempts) and 3", rec.Calls(), rec.Len())
		}
		msgs := rec.Messages()
		var got []string
		for _, m := range msgs {
			got = append(got, fmt.Sprintf("%s#%d", m.Value, m.Attempt))
		}
		if want := []string{"ok1#1", "flaky#3", "ok2#1"}; !slices.Equal(got, want) {
			t.Fatalf("recorded %q, want %q", got, want)
		}
		if st := g.Stats(); st.Retried != 2 || st.Delivered != 3 || st.DeadLettered != 0 {
			t.Fatalf("group stats %+v, want Retried 2 Delivered 3", st)
		}
	})
}

// A permanent failure is one call, no record, and a dead letter.
func TestRecorderPermanentFailureDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders")
		rec := pubsubtest.NewRecorder[string]()
		rec.FailWith(func(m pubsub.Message[string]) error {
			if m.Value == "bob:cancelled" {
				return fmt.Errorf("cancelled: %w", pubsub.ErrPermanent)
			}
			return nil
		})
		g := mustSubscribe(t, topic, "shipping", rec)
		for _, v := range []string{"alice:paid", "bob:cancelled", "carol:paid"} {
			mustPublish(t, topic, "", v)
		}
		pubsubtest.Drain(t, b)

		if rec.Calls() != 3 || !slices.Equal(rec.Values(), []string{"alice:paid", "carol:paid"}) {
			t.Fatalf("Calls %d Values %q; want 3, [alice:paid carol:paid]", rec.Calls(), rec.Values())
		}
		dls := g.DeadLetters()
		if len(dls) != 1 || dls[0].Message.Value != "bob:cancelled" || dls[0].Attempts != 1 {
			t.Fatalf("dead letters %+v, want bob:cancelled after 1 attempt", dls)
		}
	})
}

// Run with -race: Handle, FailWith and the readers from many goroutines.
func TestRecorderConcurrentUse(t *testing.T) {
	const goroutines, each = 8, 100
	rec := pubsubtest.NewRecorder[int]()
	failOdd := func(m pubsub.Message[int]) error {
		if m.Value%2 == 1 {
			return errors.New("odd")
		}
		return nil
	}
	rec.FailWith(failOdd)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- rec.WaitFor(ctx, goroutines*each/2) }()

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				rec.Handle(ctx, pubsub.Message[int]{Partition: g, Offset: int64(i), Value: i})
				_ = rec.Len() + len(rec.Values()) + len(rec.Messages())
			}
		})
	}
	wg.Go(func() {
		for range each {
			rec.FailWith(failOdd) // the same function: only the race matters
		}
	})
	wg.Wait()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if rec.Calls() != goroutines*each || rec.Len() != goroutines*each/2 {
		t.Fatalf("Calls %d Len %d; want %d and %d", rec.Calls(), rec.Len(), goroutines*each, goroutines*each/2)
	}
	for _, v := range rec.Values() {
		if v%2 == 1 {
			t.Fatalf("recorded odd value %d, which FailWith rejects", v)
		}
	}
}
