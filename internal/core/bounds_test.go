package core

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// The boundaries and bookkeeping that a mutation run found unchecked: each
// test here fails when one comparison or one counter update is changed.

func TestSeekToTheEarliestRetainedOffset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 4, OnFull: DropOldest}})
		var h recorder
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		mustPause(t, g) // nobody reads, so the oldest six are dropped
		for _, v := range values("e", 10) {
			publish(t, orders, "", v)
		}
		if earliest, end := orders.Partition(0).Bounds(); earliest != 6 || end != 10 {
			t.Fatalf("bounds [%d, %d), want [6, 10)", earliest, end)
		}
		ctx := context.Background()
		wantErr(t, g.Seek(ctx, 0, 5), ErrOffsetOutOfRange)
		if err := g.Seek(ctx, 0, 6); err != nil {
			t.Fatalf("Seek to the earliest retained offset: %v", err)
		}
		if got := g.Committed(0); got != 6 {
			t.Fatalf("Committed after Seek(0, 6) = %d, want 6", got)
		}
	})
}

func TestCommittedAndDeliveryStateOfAPartitionThatIsNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var h recorder
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		for _, p := range []int{-1, 2} {
			if got := g.Committed(p); got != -1 {
				t.Errorf("Committed(%d) = %d, want -1", p, got)
			}
			if got := g.DeliveryState(p); got != Pending {
				t.Errorf("DeliveryState(%d) = %v, want Pending", p, got)
			}
		}
		if got := g.Committed(1); got != 0 {
			t.Errorf("Committed(1) = %d, want 0", got)
		}
	})
}

// Drain registers itself as a watcher of progress while it waits, so that
// commits wake it; every way out must unregister it, or every later commit
// pays for a watcher that is gone.
func TestDrainLeavesNoWatcherBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		release := make(chan struct{})
		g := subscribe(t, b, "orders", "billing", "b1", func(ctx context.Context, d *Delivery) error {
			<-release
			return nil
		})
		watchers := func(after string) {
			t.Helper()
			if n := b.progressWatch.Load(); n != 0 {
				t.Fatalf("after %s: %d Drain watchers registered, want 0", after, n)
			}
		}

		if err := b.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		watchers("a Drain with nothing to wait for")

		publish(t, orders, "", "e0")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := b.Drain(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Drain while the handler holds e0: %v, want DeadlineExceeded", err)
		}
		watchers("a Drain whose context ended")

		done := make(chan error)
		go func() { done <- b.Drain(context.Background()) }()
		synctest.Wait()
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		watchers("a Drain that waited for a commit")

		mustPause(t, g)
		publish(t, orders, "", "e1")
		wantErr(t, b.Drain(context.Background()), ErrStalled)
		watchers("a Drain that found a stalled group")
	})
}

func TestSealedCursorKeepsItsOffset(t *testing.T) {
	var c Cursor
	c.Set(5)
	if got := c.Seal(); got != 5 {
		t.Fatalf("Seal() = %d, want 5", got)
	}
	if got := c.Seal(); got != 5 {
		t.Fatalf("second Seal() = %d, want 5", got)
	}
	if got := c.Committed(); got != 5 {
		t.Fatalf("Committed() of a sealed cursor = %d, want 5", got)
	}
	if c.Commit(5, 6) {
		t.Fatal("Commit on a sealed cursor succeeded")
	}
	var zero Cursor
	if got := zero.Seal(); got != 0 || zero.Committed() != 0 || zero.Commit(0, 1) {
		t.Fatalf("sealed at 0: Seal() = %d, Committed() = %d; a commit must fail", got, zero.Committed())
	}
}

// Naming a block of IDs costs two allocations, the block and its names, and
// two more when the block crosses to one more digit (increment grows the
// digits).
func TestRecordIDsFormatAllocations(t *testing.T) {
	ids := newRecordIDs("broker", 12, 3, 1024)
	for _, c := range []struct {
		first      int64
		last       string
		wantAllocs float64
	}{
		{6400, "broker-12-3-6463", 2},
		{10_000_000 - idBlockLen/2, "broker-12-3-10000031", 4},
	} {
		b := ids.format(c.first)
		if got := b.names[b.ends[idBlockLen-2]:b.ends[idBlockLen-1]]; got != c.last {
			t.Errorf("format(%d): last name %q, want %q", c.first, got, c.last)
		}
		if allocs := testing.AllocsPerRun(100, func() { ids.format(c.first) }); allocs > c.wantAllocs {
			t.Errorf("format(%d) allocates %v times, want at most %v", c.first, allocs, c.wantAllocs)
		}
	}
}
