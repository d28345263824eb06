package core

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
)

// subscribeKeyed subscribes h to group on topic with key concurrency n.
func subscribeKeyed(t *testing.T, b *Broker, topic, group string, n int, h Handler) *Group {
	t.Helper()
	g, err := b.Subscribe(topic, group, "c1", h, nil, GroupSpec{KeyConcurrency: n})
	if err != nil {
		t.Fatalf("Subscribe(%q, %q) with key concurrency %d: %v", topic, group, n, err)
	}
	return g
}

// slowKey is a handler that holds the records of key "slow" until release
// is closed, and records the values of the others it acked.
type slowKey struct {
	release chan struct{}
	mu      sync.Mutex
	acked   []string
}

func newSlowKey(t *testing.T) *slowKey {
	s := &slowKey{release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
	})
	return s
}

func (s *slowKey) handle(ctx context.Context, d *Delivery) error {
	if string(d.Record.Key) == "slow" {
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	s.acked = append(s.acked, string(d.Record.Value))
	s.mu.Unlock()
	return nil
}

// A record that waits in the window behind its key while retention
// evicts it (DropOldest) is passed over when its turn comes, and counted
// as skipped, as a record trimmed before the group read it is: the window
// never delivers a record the log no longer holds.
func TestKeyedRecordEvictedInTheWindowIsSkippedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 4, OnFull: DropOldest}})
		h := newSlowKey(t)
		g := subscribeKeyed(t, b, "t", "g", 2, h.handle)
		// slow-1 runs, slow-2 waits behind it, a and b are acked: the
		// commit stays at 0.
		for _, kv := range [][2]string{{"slow", "slow-1"}, {"slow", "slow-2"}, {"a", "a"}, {"b", "b"}} {
			publish(t, topic, kv[0], kv[1])
		}
		synctest.Wait()
		// Four more evict the four first: slow-1 in flight, slow-2 unread.
		for _, v := range []string{"c", "d", "e", "f"} {
			publish(t, topic, v, v)
		}
		close(h.release)
		drain(t, b)
		if got, want := sorted(h.acked), sorted([]string{"slow-1", "a", "b", "c", "d", "e", "f"}); !slices.Equal(got, want) {
			t.Errorf("acked %q, want %q (slow-2 was evicted before its turn)", got, want)
		}
		if s := g.Stats(); s.Skipped != 1 || s.Delivered != 7 {
			t.Errorf("stats %+v, want 1 skipped (slow-2) and 7 delivered", s)
		}
		if got := g.Committed(0); got != 8 {
			t.Errorf("Committed(0): got %d, want 8", got)
		}
	})
}

// Records trimmed past the window's end before the worker read them are
// skipped as a gap once the window's own records settled: the gap is
// counted once, after the record in flight, never before it.
func TestKeyedGapPastTheWindowIsSkippedOnceTheWindowSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 2, OnFull: DropOldest}})
		h := newSlowKey(t)
		g := subscribeKeyed(t, b, "t", "g", 2, h.handle)
		publish(t, topic, "slow", "slow")
		publish(t, topic, "a", "a")
		synctest.Wait()
		for _, v := range []string{"b", "c", "d", "e"} { // b and c are trimmed unread
			publish(t, topic, v, v)
		}
		synctest.Wait()
		if got := g.Committed(0); got != 0 {
			t.Fatalf("Committed(0) while slow runs: got %d, want 0", got)
		}
		close(h.release)
		drain(t, b)
		if got, want := sorted(h.acked), []string{"a", "d", "e", "slow"}; !slices.Equal(got, want) {
			t.Errorf("acked %q, want %q", got, want)
		}
		if s := g.Stats(); s.Skipped != 2 || s.Delivered != 4 {
			t.Errorf("stats %+v, want 2 skipped (b, c) and 4 delivered", s)
		}
	})
}

// A dead letter sent back to a group with key concurrency is delivered
// alone, once no delivery of its partition is in flight: its key may be
// one of theirs.
func TestKeyedRedrivenLetterWaitsForTheDeliveriesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{})
		var (
			mu       sync.Mutex
			running  int
			fixed    bool
			together []int // how many ran beside the redriven letter
		)
		release := make(chan struct{})
		g := subscribeKeyed(t, b, "t", "g", 3, func(ctx context.Context, d *Delivery) error {
			mu.Lock()
			running++
			if string(d.Record.Value) == "poison" && fixed {
				together = append(together, running-1)
			}
			poisoned := string(d.Record.Value) == "poison" && !fixed
			mu.Unlock()
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			if poisoned {
				return ErrPermanent
			}
			if string(d.Record.Key) == "held" {
				<-release
			}
			return nil
		})
		publish(t, topic, "p", "poison")
		drain(t, b)
		mu.Lock()
		fixed = true
		mu.Unlock()
		publish(t, topic, "held", "h1")
		publish(t, topic, "k", "k1")
		synctest.Wait() // h1 in flight
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v; want 1, nil", n, err)
		}
		synctest.Wait()
		mu.Lock()
		early := len(together)
		mu.Unlock()
		if early != 0 {
			t.Errorf("the redriven letter was delivered while h1 was in flight")
		}
		close(release)
		drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(together, []int{0}) {
			t.Errorf("the redriven letter ran beside %v other deliveries, want once beside none", together)
		}
		if s := g.Stats(); s.Delivered != 3 || s.Redriven != 1 || len(g.DeadLetters()) != 0 {
			t.Errorf("stats %+v with %d dead letters, want 3 delivered, 1 redriven, none left", s, len(g.DeadLetters()))
		}
	})
}

// SubscribeBatch refuses key concurrency: a batch is already a unit of
// concurrency.
func TestKeyConcurrencyIsRefusedToBatchConsumers(t *testing.T) {
	b := newBroker(t, Config{})
	mustTopic(t, b, "t", TopicSpec{})
	_, err := b.SubscribeBatch("t", "g", "c1", func(context.Context, *Batch) error { return nil }, nil,
		GroupSpec{KeyConcurrency: 2}, BatchSpec{})
	wantErr(t, err, ErrInvalid)
}

// Found by the property suite (TestQueueProperties): a worker that starts
// with a window whose records were trimmed meanwhile, and finds the
// records past the window trimmed too, passes over the window's records
// as they come up and must then read on. It waited instead, for a bell no
// append would ring: the window was empty and nothing was in flight.
// Here: slow-2 waits behind slow-1 when the group pauses; six publishes
// then trim both and the two records after them; on Resume, the window
// holds slow-2 alone, trimmed, and the log starts past its end.
func TestKeyedWorkerReadsOnAfterPassingOverTrimmedRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		topic := mustTopic(t, b, "t", TopicSpec{Retention: Retention{MaxMessages: 4, OnFull: DropOldest}})
		h := newSlowKey(t)
		g := subscribeKeyed(t, b, "t", "g", 2, h.handle)
		publish(t, topic, "slow", "slow-1")
		publish(t, topic, "slow", "slow-2")
		synctest.Wait()
		paused := make(chan error, 1)
		go func() { paused <- g.Pause(context.Background()) }() // returns once slow-1 ended
		synctest.Wait()
		close(h.release)
		if err := <-paused; err != nil {
			t.Fatalf("Pause: %v", err)
		}
		for _, v := range []string{"a", "b", "c", "d", "e", "f"} { // trims offsets 0 to 3
			publish(t, topic, v, v)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		drain(t, b)
		if got, want := sorted(h.acked), []string{"c", "d", "e", "f", "slow-1"}; !slices.Equal(got, want) {
			t.Errorf("acked %q, want %q", got, want)
		}
		if s := g.Stats(); s.Skipped != 3 || s.Delivered != 5 {
			t.Errorf("stats %+v, want 3 skipped (slow-2, a, b) and 5 delivered", s)
		}
	})
}

// Snapshot's Running and OldestUnsettled say the same without key
// concurrency: one delivery in flight at the committed offset, or none
// (-1) once it settled; a record waiting out its backoff is unsettled,
// not running.
func TestSnapshotShowsTheUnsettledRecordOfAGroupOfOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}})
		topic := mustTopic(t, b, "t", TopicSpec{})
		release := make(chan struct{})
		subscribe(t, b, "t", "g", "c1", func(_ context.Context, d *Delivery) error {
			if d.Attempt == 1 {
				<-release
				return errors.New("boom")
			}
			return nil
		})
		publish(t, topic, "", "v")
		part := func() engine.GroupPartitionSnapshot { return b.Snapshot().Topics[0].Groups[0].Partitions[0] }
		synctest.Wait()
		if p := part(); p.Running != 1 || p.OldestUnsettled != 0 || !p.InFlight {
			t.Errorf("in flight: %+v, want 1 running at the oldest unsettled offset 0", p)
		}
		close(release)
		synctest.Wait()
		if p := part(); p.Running != 0 || p.OldestUnsettled != 0 || !p.Retrying {
			t.Errorf("waiting out its backoff: %+v, want none running, the oldest unsettled offset 0", p)
		}
		drain(t, b)
		if p := part(); p.Running != 0 || p.OldestUnsettled != -1 {
			t.Errorf("drained: %+v, want none running and no unsettled offset (-1)", p)
		}
	})
}
