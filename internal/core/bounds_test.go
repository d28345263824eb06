package core

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
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

// Records already appended are read without the partition's lock (see
// Partition.Read): a worker does not queue behind producers. The read runs
// while the test holds the lock; the timeout only bounds a failure.
func TestReadOfRetainedRecordsTakesNoLock(t *testing.T) {
	b := newBroker(t, Config{})
	orders := mustTopic(t, b, "orders", TopicSpec{})
	for _, v := range values("e", 10) {
		publish(t, orders, "", v)
	}
	part := orders.Partition(0)
	type read struct {
		n    int
		recs []*Record
	}
	for _, c := range []struct{ offset, max, want int }{{0, 4, 4}, {2, 16, 8}, {9, 4, 1}} {
		part.mu.Lock()
		got := make(chan read, 1)
		go func() {
			dst := make([]*Record, c.max)
			n, _, _ := part.Read(int64(c.offset), dst, new(Cursor), make(chan struct{}, 1))
			got <- read{n, dst[:n]}
		}()
		select {
		case r := <-got:
			part.mu.Unlock()
			if r.n != c.want {
				t.Fatalf("Read(%d, [%d]) = %d records, want %d", c.offset, c.max, r.n, c.want)
			}
			for i, rec := range r.recs {
				if rec.Offset != int64(c.offset+i) {
					t.Fatalf("Read(%d, …)[%d] has offset %d", c.offset, i, rec.Offset)
				}
			}
		case <-time.After(10 * time.Second):
			part.mu.Unlock()
			t.Fatalf("Read(%d, …) waited for the partition's lock", c.offset)
		}
	}
}

// Under MaxAge a read takes the lock, to trim by age first; it still fills
// the caller's buffer, and no more.
func TestReadUnderMaxAgeFillsTheBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxAge: time.Hour}})
		for _, v := range values("e", 10) {
			publish(t, orders, "", v)
		}
		dst := make([]*Record, 4)
		n, skipTo, waiting := orders.Partition(0).Read(3, dst, new(Cursor), make(chan struct{}, 1))
		if n != 4 || skipTo != 0 || waiting || dst[0].Offset != 3 || dst[3].Offset != 6 {
			t.Fatalf("Read(3, [4]) = %d, %d, %v; want 4 records from offset 3", n, skipTo, waiting)
		}
	})
}

// Without MaxAge nothing expires, however old.
func TestNoMaxAgeExpiresNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		publish(t, orders, "", "old")
		time.Sleep(24 * time.Hour) // virtual time: the record ages a day
		publish(t, orders, "", "new")
		dst := make([]*Record, 4)
		c, bell := new(Cursor), make(chan struct{}, 1)
		if n, skipTo, _ := orders.Partition(0).Read(0, dst, c, bell); n != 2 || skipTo != 0 {
			t.Fatalf("Read(0) = %d records, skip to %d; want both records", n, skipTo)
		}
		// A read that finds nothing new takes the partition's lock, where
		// age retention would trim.
		if n, skipTo, waiting := orders.Partition(0).Read(2, dst, c, bell); n != 0 || skipTo != 0 || !waiting {
			t.Fatalf("Read(2) = %d records, skip to %d, waiting %v; want to wait", n, skipTo, waiting)
		}
		if st := orders.Stats()[0]; st.Retained != 2 || st.Expired != 0 {
			t.Fatalf("stats %+v: want 2 retained, none expired", st)
		}
	})
}

// Without an IDSource every delivery still carries an ID: one per record,
// the same for every group.
func TestDeliveriesAreNamedWithoutAnIDSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var mu sync.Mutex
		ids := map[string]map[int64]string{} // group → offset → ID, partition 0
		seen := map[string]bool{}
		handler := func(group string) Handler {
			return func(_ context.Context, d *Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if d.ID == "" {
					t.Errorf("%s: delivery of partition %d offset %d has no ID", group, d.Partition, d.Record.Offset)
				}
				if d.Partition == 0 {
					ids[group][d.Record.Offset] = d.ID
				}
				if group == "billing" {
					if seen[d.ID] {
						t.Errorf("ID %q given twice", d.ID)
					}
					seen[d.ID] = true
				}
				return nil
			}
		}
		for _, g := range []string{"billing", "audit"} {
			ids[g] = map[int64]string{}
			subscribe(t, b, "orders", g, g+"-1", handler(g))
		}
		for i := range 6 {
			rec := orders.NewRecord()
			rec.Value = []byte{byte(i)}
			if _, err := orders.AppendOne(context.Background(), i%2, rec); err != nil {
				t.Fatal(err)
			}
		}
		drain(t, b)
		if len(seen) != 6 || len(ids["billing"]) != 3 || !maps.Equal(ids["billing"], ids["audit"]) {
			t.Fatalf("IDs: %d distinct, partition 0 billing %v audit %v", len(seen), ids["billing"], ids["audit"])
		}
	})
}

// A partition outside the topic is ErrInvalid, at its very boundary too.
func TestAppendToAPartitionThatIsNot(t *testing.T) {
	b := newBroker(t, Config{})
	orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
	for _, p := range []int{-1, 2} {
		if _, err := orders.AppendOne(context.Background(), p, orders.NewRecord()); !errors.Is(err, ErrInvalid) {
			t.Errorf("AppendOne to partition %d: %v, want ErrInvalid", p, err)
		}
		if orders.Partition(p) != nil {
			t.Errorf("Partition(%d) is not nil", p)
		}
	}
}

// A record that MaxAge trims while it waits in a worker's batch is not
// delivered: it is skipped and counted, as if it had not been read.
func TestRecordThatExpiresInTheWorkersBatchIsSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxAge: time.Minute}})
		release := make(chan struct{})
		var mu sync.Mutex
		var got []string
		g := subscribe(t, b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
			if string(d.Record.Value) == "e0" {
				<-release
			}
			mu.Lock()
			got = append(got, string(d.Record.Value))
			mu.Unlock()
			return nil
		})
		mustPause(t, g) // so the worker reads e0, e1 and e2 in one batch
		for _, v := range []string{"e0", "e1", "e2"} {
			publish(t, orders, "", v)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()              // e0 is in its handler, e1 and e2 in the batch
		time.Sleep(2 * time.Minute)  // virtual time: all three age past MaxAge
		publish(t, orders, "", "e3") // the append trims them
		close(release)
		drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(got, []string{"e0", "e3"}) || g.Stats().Skipped != 2 {
			t.Fatalf("delivered %v, skipped %d; want [e0 e3] and 2 skipped", got, g.Stats().Skipped)
		}
	})
}
