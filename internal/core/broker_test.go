package core

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
)

func subscribe(t *testing.T, b *Broker, topic, group, consumer string, h Handler) *Group {
	t.Helper()
	g, err := b.Subscribe(topic, group, consumer, h, nil, GroupSpec{})
	if err != nil {
		t.Fatalf("Subscribe(%q, %q, %q): %v", topic, group, consumer, err)
	}
	return g
}

func TestTwoGroupsHaveIndependentCursorsAndPerKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var billing, audit recorder
		subscribe(t, b, "orders", "billing", "billing-1", billing.handler("billing-1"))
		subscribe(t, b, "orders", "audit", "audit-1", audit.handler("audit-1"))

		for _, e := range [][2]string{{"alice", "created"}, {"bob", "created"}, {"alice", "paid"}, {"alice", "shipped"}} {
			publish(t, orders, e[0], e[0]+":"+e[1])
		}
		drain(t, b)

		if got, want := sorted(billing.acked()), sorted(audit.acked()); !slices.Equal(got, want) || len(got) != 4 {
			t.Fatalf("billing got %v, audit got %v; want the same 4 records each", got, want)
		}
		if got, want := billing.ackedByKey("alice"), []string{"alice:created", "alice:paid", "alice:shipped"}; !slices.Equal(got, want) {
			t.Errorf("alice's records reached billing as %v, want %v", got, want)
		}
		for _, group := range []string{"billing", "audit"} {
			if lag, err := lagOf(b, group, "orders"); lag != 0 || err != nil {
				t.Errorf("Lag(%s) = %d, %v; want 0", group, lag, err)
			}
		}
		// The groups share records: both were handed the very same *Record.
		byPos := map[Position]*Record{}
		for _, d := range billing.snapshot() {
			byPos[Position{d.partition, d.rec.Offset}] = d.shared
		}
		for _, d := range audit.snapshot() {
			if byPos[Position{d.partition, d.rec.Offset}] != d.shared {
				t.Errorf("record %d/%d was copied for audit", d.partition, d.rec.Offset)
			}
		}
	})
}

func TestTransientFailureIsRetriedAndPoisonIsDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, Multiplier: 2, MaxDelay: time.Minute}})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		start := time.Now()
		var times []time.Duration
		shipping := recorder{fail: func(rec *Record, attempt int) error {
			if string(rec.Value) == "bob:cancelled" {
				times = append(times, time.Since(start))
				return fmt.Errorf("cannot process %s", rec.Value)
			}
			if attempt == 1 {
				return errors.New("transient")
			}
			return nil
		}}
		g := subscribe(t, b, "orders", "shipping", "shipping-1", shipping.handler("shipping-1"))
		publish(t, orders, "alice", "alice:paid")
		publish(t, orders, "bob", "bob:cancelled")
		publish(t, orders, "alice", "alice:shipped")
		drain(t, b)

		if got, want := shipping.acked(), []string{"alice:paid", "alice:shipped"}; !slices.Equal(got, want) {
			t.Errorf("acked %v, want %v", got, want)
		}
		if n := shipping.attemptsOf("alice:paid"); n != 2 {
			t.Errorf("alice:paid delivered %d times, want 2", n)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 || string(letters[0].Record.Value) != "bob:cancelled" || letters[0].Attempts != 3 ||
			letters[0].Err == nil || letters[0].Group != "shipping" {
			t.Fatalf("dead letters %+v, want bob:cancelled after 3 attempts", letters)
		}
		// Backoff: attempts 1s then 2s apart (virtual time), after alice:paid's own 1s retry.
		if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}; !slices.Equal(times, want) {
			t.Errorf("poison attempts at %v, want %v", times, want)
		}
		want := GroupStats{Delivered: 2, Retried: 4, DeadLettered: 1}
		if got := g.Stats(); got != want {
			t.Errorf("stats %+v, want %+v", got, want)
		}
		if lag := g.Lag(); lag != 0 {
			t.Errorf("lag %d, want 0: the dead letter must let the partition move on", lag)
		}
	})
}

func TestPermanentErrorSkipsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		h := recorder{fail: func(*Record, int) error { return fmt.Errorf("bad order: %w", ErrPermanent) }}
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		publish(t, orders, "", "x")
		drain(t, b)
		if letters := g.DeadLetters(); len(letters) != 1 || letters[0].Attempts != 1 {
			t.Fatalf("dead letters %+v, want one after 1 attempt", letters)
		}
		if s := g.Stats(); s.Retried != 0 || s.DeadLettered != 1 {
			t.Errorf("stats %+v, want no retries and one dead letter", s)
		}
	})
}

func TestPanickingHandlerDoesNotKillItsWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 2}})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		h := recorder{fail: func(rec *Record, _ int) error {
			if string(rec.Value) == "boom" {
				panic("handler bug")
			}
			return nil
		}}
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		publish(t, orders, "", "boom")
		publish(t, orders, "", "after")
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"after"}) {
			t.Errorf("acked %v, want [after]: the worker must survive the panic", got)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("got %d dead letters, want 1", len(letters))
		}
		pe, ok := errors.AsType[*PanicError](letters[0].Err)
		if !ok || pe.Value != "handler bug" || len(pe.Stack) == 0 || letters[0].Attempts != 2 {
			t.Errorf("dead letter error %v (attempts %d), want a *PanicError with value and stack after 2 attempts",
				letters[0].Err, letters[0].Attempts)
		}
	})
}

// TestBlockBackpressureThenReclaim: a group that commits nothing keeps a
// Block partition full; once it commits, its records are reclaimed. (Block
// waits only for groups: without one, a full partition trims instead; see
// retention_test.go.)
func TestBlockBackpressureThenReclaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 2, BlockTimeout: 20 * time.Millisecond}})
		release := make(chan struct{})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", func(ctx context.Context, d *Delivery) error {
			<-release // commits nothing until the test lets go
			return h.handler("b1")(ctx, d)
		})
		publish(t, orders, "alice", "first")
		publish(t, orders, "alice", "second")

		start := time.Now()
		_, err := orders.Publish(context.Background(), []byte("alice"), []byte("third"), nil)
		wantErr(t, err, ErrBackpressure)
		if waited := time.Since(start); waited != 20*time.Millisecond {
			t.Errorf("the producer waited %v, want exactly the BlockTimeout", waited)
		}
		if s := orders.Partition(0).Stats(); s.End != 2 || s.Blocked != 1 || s.TimedOut != 1 {
			t.Errorf("stats %+v: want end 2 (nothing appended), 1 blocked, 1 timed out", s)
		}

		close(release)
		drain(t, b)
		publish(t, orders, "alice", "third") // the committed records are reclaimed
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"first", "second", "third"}) {
			t.Errorf("acked %v", got)
		}
	})
}

// TestBlockedProducerWakesOnCommit: a producer parked on a full partition is
// woken by the commit that frees room, before its timeout.
func TestBlockedProducerWakesOnCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 1, BlockTimeout: time.Hour}})
		release := make(chan struct{})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", func(ctx context.Context, d *Delivery) error {
			<-release
			return h.handler("b1")(ctx, d)
		})
		publish(t, orders, "", "one")
		start := time.Now()
		done := make(chan error)
		go func() {
			_, err := orders.Publish(context.Background(), nil, []byte("two"), nil)
			done <- err
		}()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the second publish returned %v while the partition was full", err)
		default:
		}
		release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatalf("publish after the commit: %v", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the producer waited %v of virtual time, want 0: it must wake on the commit", waited)
		}
		close(release)
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"one", "two"}) {
			t.Errorf("acked %v", got)
		}
	})
}

func TestDropOldestShedsAndFastForwardsASlowGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 3, OnFull: DropOldest}})
		var h recorder
		g := subscribe(t, b, "orders", "slow", "s1", h.handler("s1"))
		mustPause(t, g)
		for _, v := range values("e", 6) {
			publish(t, orders, "", v)
		}
		if s := orders.Partition(0).Stats(); s.Dropped != 3 || s.Earliest != 3 || s.End != 6 {
			t.Fatalf("stats %+v, want 3 dropped, earliest 3, end 6", s)
		}
		_ = g.Resume(context.Background())
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"e003", "e004", "e005"}) {
			t.Errorf("the slow group got %v, want the 3 retained records", got)
		}
		if s := g.Stats(); s.Skipped != 3 || s.Delivered != 3 {
			t.Errorf("stats %+v, want 3 skipped and 3 delivered", s)
		}
	})
}

func TestAgeRetentionOnAFakeClock(t *testing.T) {
	clock := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := newBroker(t, Config{Clock: clock})
	orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxAge: 10 * time.Second}})
	var slow recorder
	g := subscribe(t, b, "orders", "slow", "s1", slow.handler("s1"))
	mustPause(t, g) // an existing group that falls behind
	publish(t, orders, "", "old-1")
	publish(t, orders, "", "old-2")
	clock.Advance(10 * time.Second)
	publish(t, orders, "", "edge") // exactly MaxAge old later: kept
	clock.Advance(time.Second)
	publish(t, orders, "", "new")
	s := orders.Partition(0).Stats()
	if s.Expired != 2 || s.Earliest != 2 || s.End != 4 {
		t.Fatalf("stats %+v, want the 2 records older than 10s expired", s)
	}
	_ = g.Resume(context.Background())
	drain(t, b)
	if got := slow.acked(); !slices.Equal(got, []string{"edge", "new"}) {
		t.Errorf("acked %v, want [edge new]", got)
	}
	if s := g.Stats(); s.Skipped != 2 {
		t.Errorf("the slow group skipped %d, want the 2 expired records", s.Skipped)
	}
}

// TestLateGroupStartsAtTheEarliestRetainedRecord: records trimmed before a
// group existed are not the group's loss. Regression: a new group's cursor
// started at 0, so a late group under Block counted the records the first
// group's commits had reclaimed as Skipped, though nothing was ever lost.
func TestLateGroupStartsAtTheEarliestRetainedRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 2}})
		var first recorder
		subscribe(t, b, "orders", "first", "f1", first.handler("f1"))
		for _, v := range values("r", 5) {
			publish(t, orders, "", v)
			drain(t, b)
		}
		earliest, _ := orders.Partition(0).Bounds()
		var late recorder
		g := subscribe(t, b, "orders", "late", "l1", late.handler("l1"))
		drain(t, b)
		if s := g.Stats(); s.Skipped != 0 || s.Delivered != 5-earliest {
			t.Errorf("late group stats %+v, want %d delivered and none skipped", s, 5-earliest)
		}
		if s := orders.Partition(0).Stats(); s.Reclaimed != earliest || s.Dropped != 0 {
			t.Errorf("partition stats %+v: want the trimmed records counted as reclaimed", s)
		}
	})
}

// TestDropOldestSkipsBufferedRecordsEvictedBeforeTheirAttempt. Regression.
// The interleaving: the worker reads r0..r2 in one batch and blocks in the
// handler on r0; the producer then publishes r3..r7, and DropOldest evicts
// r0..r4. r0's attempt had begun, so it completes; r1 and r2 sat in the
// worker's batch and used to be delivered anyway, after eviction, so
// Delivered and Skipped depended on batch timing. Now an evicted record is
// delivered only if its attempt began before the eviction.
func TestDropOldestSkipsBufferedRecordsEvictedBeforeTheirAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 3, OnFull: DropOldest}})
		gate := make(chan struct{})
		var h recorder
		g := subscribe(t, b, "orders", "slow", "s1", func(ctx context.Context, d *Delivery) error {
			rec := d.Record
			if string(rec.Value) == "r000" {
				<-gate
			}
			return h.handler("s1")(ctx, d)
		})
		mustPause(t, g)
		for _, v := range values("r", 3) {
			publish(t, orders, "", v)
		}
		_ = g.Resume(context.Background())
		synctest.Wait() // the worker holds r0..r2 and is inside the handler for r0
		for _, v := range values("r", 8)[3:] {
			publish(t, orders, "", v)
		}
		close(gate)
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"r000", "r005", "r006", "r007"}) {
			t.Errorf("delivered %v, want r000 (attempt begun) and the retained r005..r007", got)
		}
		if s := g.Stats(); s.Skipped != 4 || s.Delivered != 4 {
			t.Errorf("stats %+v, want 4 delivered and r001..r004 skipped", s)
		}
		if s := orders.Partition(0).Stats(); s.Dropped != 5 {
			t.Errorf("dropped %d, want 5", s.Dropped)
		}
	})
}

// TestEvictedWhileWaitingForARetry: a record DropOldest evicts during its
// backoff is not retried; the group skips it and counts it.
func TestEvictedWhileWaitingForARetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 3, BaseDelay: time.Minute}})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 1, OnFull: DropOldest}})
		h := recorder{fail: func(rec *Record, _ int) error {
			if string(rec.Value) == "flaky" {
				return errors.New("transient")
			}
			return nil
		}}
		g := subscribe(t, b, "orders", "g", "c1", h.handler("c1"))
		publish(t, orders, "", "flaky")
		synctest.Wait()                // failed once, waiting out a minute
		publish(t, orders, "", "next") // evicts flaky
		drain(t, b)
		if n := h.attemptsOf("flaky"); n != 1 {
			t.Errorf("flaky was attempted %d times, want 1: evicted records are not retried", n)
		}
		if got, s := h.acked(), g.Stats(); !slices.Equal(got, []string{"next"}) || s.Skipped != 1 || s.Retried != 1 {
			t.Errorf("acked %v, stats %+v; want [next], 1 skipped, 1 retried", got, s)
		}
	})
}

// TestBlockedProducerWakesWhenTheOldestRecordExpires: age retention makes
// room for a producer blocked on a full partition as soon as the oldest
// record is strictly older than MaxAge, not at the end of BlockTimeout.
func TestBlockedProducerWakesWhenTheOldestRecordExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{}) // the wall clock is virtual in the bubble
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 1, MaxAge: 10 * time.Second, BlockTimeout: time.Hour}})
		release := make(chan struct{})
		defer close(release)
		subscribe(t, b, "orders", "billing", "b1", stuckHandler(release)) // commits nothing: only age makes room
		publish(t, orders, "", "old")
		start := time.Now()
		publish(t, orders, "", "new")
		if waited := time.Since(start); waited != 10*time.Second+time.Nanosecond {
			t.Errorf("the producer waited %v, want 10s+1ns", waited)
		}
		if s := orders.Partition(0).Stats(); s.Expired != 1 || s.End != 2 {
			t.Errorf("stats %+v, want 1 expired and 2 published", s)
		}
	})
}

// TestConcurrentProducers: 8 producers × 50 records into 4 partitions, two
// consumers in one group, no failures: unique offsets, exactly-once delivery.
func TestConcurrentProducers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 4, Retention: Retention{MaxMessages: 512}})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		subscribe(t, b, "orders", "billing", "b2", h.handler("b2"))

		var mu sync.Mutex
		placed := map[Position]bool{}
		var wg sync.WaitGroup
		for p := range 8 {
			wg.Go(func() {
				for i := range 50 {
					n := p*50 + i
					pos, err := orders.Publish(context.Background(), fmt.Appendf(nil, "user-%d", n), fmt.Appendf(nil, "event-%03d", n), nil)
					if err != nil {
						t.Errorf("publish %d: %v", n, err)
						return
					}
					mu.Lock()
					if placed[pos] {
						t.Errorf("position %+v handed out twice", pos)
					}
					placed[pos] = true
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		var ends int64
		for i := range 4 {
			ends += orders.Partition(i).End()
		}
		if len(placed) != 400 || ends != 400 {
			t.Fatalf("%d unique positions and %d records in the log, want 400 each", len(placed), ends)
		}
		drain(t, b)
		if got, want := sorted(h.acked()), values("event-", 400); !slices.Equal(got, want) {
			t.Errorf("delivered %d records (with duplicates or gaps), want each of 400 exactly once", len(got))
		}
		consumers := map[string]bool{}
		for _, d := range h.snapshot() {
			consumers[d.consumer] = true
		}
		if len(consumers) != 2 {
			t.Errorf("deliveries went to %v, want both consumers", consumers)
		}
	})
}

func TestReplayRedeliversEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		for _, v := range values("e", 6) {
			publish(t, orders, "", v)
		}
		drain(t, b)
		if err := replayGroup(b, "billing", "orders", Start{Kind: StartOffset, Offset: 0}); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		if got := h.acked(); len(got) != 12 {
			t.Fatalf("acked %d records, want 12 (6, then 6 again)", len(got))
		}
		if got, want := sorted(h.acked()[6:]), values("e", 6); !slices.Equal(got, want) {
			t.Errorf("replay delivered %v, want %v", got, want)
		}
		for _, d := range h.snapshot()[6:] {
			if d.attempt != 1 {
				t.Errorf("replayed %s with attempt %d, want 1: a replay starts a new epoch", d.rec.Value, d.attempt)
			}
		}
		// Replay from the middle: max(from, earliest), per partition.
		if err := replayGroup(b, "billing", "orders", Start{Kind: StartOffset, Offset: 2}); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		if got := len(h.acked()); got != 14 {
			t.Errorf("after a replay from offset 2 of partitions holding 3 each, %d acked in all, want 14", got)
		}
	})
}

func TestLateSubscriberReadsTheBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		for _, v := range values("e", 5) {
			publish(t, orders, "", v)
		}
		var h recorder
		subscribe(t, b, "orders", "late", "l1", h.handler("l1"))
		drain(t, b)
		if got, want := h.acked(), values("e", 5); !slices.Equal(got, want) {
			t.Errorf("late group got %v, want %v in order", got, want)
		}
	})
}

// TestRebalanceNeitherLosesNorRedelivers: a consumer joins while the
// partition that moves is in the middle of a delivery. The join returns at
// once; the delivery finishes and commits, and only then does the new owner
// start on the partition.
func TestRebalanceNeitherLosesNorRedelivers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var h recorder
		gate := make(chan struct{})
		var gated sync.Once
		slow := func(ctx context.Context, d *Delivery) error {
			if d.Partition == 1 {
				gated.Do(func() { <-gate })
			}
			return h.handler("c1")(ctx, d)
		}
		g := subscribe(t, b, "orders", "billing", "c1", slow)
		for i := range 20 {
			publish(t, orders, "", fmt.Sprintf("e%03d", i)) // round robin over both partitions
		}
		synctest.Wait() // c1 is inside the handler for partition 1's first record

		if _, err := b.Subscribe("orders", "billing", "c2", h.handler("c2"), nil, GroupSpec{}); err != nil {
			t.Fatal(err)
		}
		if got := g.Assignment(); !slices.Equal(got["c1"], []int{0}) || !slices.Equal(got["c2"], []int{1}) {
			t.Errorf("assignment %v, want c1:[0] c2:[1]", got)
		}
		synctest.Wait()
		for _, d := range h.snapshot() {
			if d.consumer == "c2" {
				t.Fatalf("c2 got %s while c1's delivery on partition 1 was in flight", d.rec.Value)
			}
		}
		close(gate)
		for i := 20; i < 40; i++ {
			publish(t, orders, "", fmt.Sprintf("e%03d", i))
		}
		drain(t, b)
		if got, want := sorted(h.acked()), values("e", 40); !slices.Equal(got, want) {
			t.Fatalf("delivered %d records, want each of 40 exactly once", len(got))
		}
		if n := len(h.snapshot()); n != 40 {
			t.Errorf("%d handler calls for 40 records: a clean rebalance redelivers nothing", n)
		}
	})
}

func TestLeaveRebalancesToTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 3})
		var h recorder
		g := subscribe(t, b, "orders", "billing", "c1", h.handler("c1"))
		subscribe(t, b, "orders", "billing", "c2", h.handler("c2"))
		left := false
		if _, err := b.Subscribe("orders", "billing", "c3", h.handler("c3"), func() { left = true }, GroupSpec{}); err != nil {
			t.Fatal(err)
		}
		if err := g.Leave(context.Background(), "c3"); err != nil {
			t.Fatal(err)
		}
		if !left {
			t.Error("onLeave was not called")
		}
		if got := g.Assignment(); len(got) != 2 || len(got["c1"])+len(got["c2"]) != 3 {
			t.Fatalf("assignment %v after c3 left, want 3 partitions over c1 and c2", got)
		}
		for _, v := range values("e", 9) {
			publish(t, orders, "", v)
		}
		drain(t, b)
		for _, d := range h.snapshot() {
			if d.consumer == "c3" {
				t.Errorf("c3 got %s after it left", d.rec.Value)
			}
		}
		if got := sorted(h.acked()); !slices.Equal(got, values("e", 9)) {
			t.Errorf("acked %v", got)
		}
		wantErr(t, g.Leave(context.Background(), "c3"), ErrSubscription)
	})
}

func TestSeek(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		var h recorder
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		for _, v := range values("e", 5) {
			publish(t, orders, "", v)
		}
		drain(t, b)
		if err := g.Seek(context.Background(), 0, 3); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		if got := h.acked()[5:]; !slices.Equal(got, []string{"e003", "e004"}) {
			t.Errorf("after Seek(0, 3) got %v, want [e003 e004]", got)
		}
		wantErr(t, g.Seek(context.Background(), 0, 6), ErrOffsetOutOfRange)
		wantErr(t, g.Seek(context.Background(), 0, -1), ErrOffsetOutOfRange)
		wantErr(t, g.Seek(context.Background(), 1, 0), ErrInvalid)
		if err := g.Seek(context.Background(), 0, 5); err != nil || g.Committed(0) != 5 {
			t.Errorf("Seek to the end: %v, committed %d; want nil, 5", err, g.Committed(0))
		}
	})
}

func TestPauseAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		var h recorder
		g := subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		mustPause(t, g)
		publish(t, orders, "", "while-paused")
		if err := b.Drain(context.Background()); !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), `"billing"`) {
			t.Fatalf("Drain with a paused group that lags: %v, want ErrStalled naming billing", err)
		}
		synctest.Wait()
		if got := h.acked(); len(got) != 0 || g.Lag() != 1 {
			t.Fatalf("a paused group got %v (lag %d)", got, g.Lag())
		}
		_ = g.Resume(context.Background())
		drain(t, b)
		if got := h.acked(); !slices.Equal(got, []string{"while-paused"}) || g.Lag() != 0 {
			t.Errorf("after Resume got %v, lag %d", got, g.Lag())
		}
	})
}

func TestDeliveryStateWalk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		step := make(chan error)
		g := subscribe(t, b, "orders", "billing", "b1", func(context.Context, *Delivery) error { return <-step })
		synctest.Wait()
		check := func(want DeliveryState, committed int64) {
			t.Helper()
			synctest.Wait()
			if got := g.DeliveryState(0); got != want || g.Committed(0) != committed {
				t.Fatalf("state %v committed %d, want %v committed %d", got, g.Committed(0), want, committed)
			}
		}
		check(Pending, 0)
		publish(t, orders, "", "a")
		check(InFlight, 0)
		step <- nil
		check(Acked, 1)
		publish(t, orders, "", "b")
		check(InFlight, 1)
		step <- errors.New("no")
		check(RetryScheduled, 1)
		time.Sleep(time.Second) // the backoff, in virtual time
		check(InFlight, 1)
		step <- errors.New("no again")
		check(DeadLettered, 2)
	})
}

// TestAcksShownWhenAWorkerStopsMidRead: an ack the worker leaves for its next
// record's InFlight to show is counted while that record's handler runs, and
// shown with the state Acked when the worker stops before reaching it.
func TestAcksShownWhenAWorkerStopsMidRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		for _, v := range values("e", 5) {
			publish(t, orders, "", v) // before anyone reads: the first read takes all five
		}
		inSecond, release := make(chan struct{}), make(chan struct{})
		g := subscribe(t, b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
			rec := d.Record
			if rec.Offset == 1 {
				close(inSecond)
				<-release
			}
			return nil
		})
		<-inSecond
		if got, state := g.Stats().Delivered, g.DeliveryState(0); got != 1 || state != InFlight {
			t.Fatalf("during the second delivery: delivered %d, state %v; want 1, in-flight", got, state)
		}
		paused := make(chan struct{})
		go func() {
			mustPause(t, g)
			close(paused)
		}()
		synctest.Wait() // Pause has told the worker to stop and waits for its delivery
		close(release)
		<-paused
		if got, state := g.Stats().Delivered, g.DeliveryState(0); got != 2 || state != Acked || g.Committed(0) != 2 {
			t.Errorf("after Pause: delivered %d, state %v, committed %d; want 2, acked, 2", got, state, g.Committed(0))
		}
	})
}

// trapClock is a Clock that, once armed, holds the next goroutine that
// reads it until release is closed, closing trapped when it has one.
type trapClock struct {
	mu               sync.Mutex
	armed            bool
	pass             int // reads to let through before the trap springs
	trapped, release chan struct{}
}

func (c *trapClock) arm() { c.armAfter(0) }

// armAfter arms the trap for the read after the next n.
func (c *trapClock) armAfter(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.pass = true, n
}

func (c *trapClock) Now() time.Time {
	c.mu.Lock()
	armed := c.armed && c.pass == 0
	if armed {
		c.armed = false
	} else if c.armed {
		c.pass--
	}
	c.mu.Unlock()
	if armed {
		close(c.trapped)
		<-c.release
	}
	return time.Now()
}

// TestAnAckIsShownBeforeItsCommit: whoever sees a record committed (Drain,
// woken by that commit, or anyone reading the cursor) also sees it counted
// as delivered, with the state Acked. To look between the commit and what
// the worker does after it, the test holds Drain's wake-up, where the
// worker stops right after the commit, and learns of the commit from the
// producer it wakes (caught in the clock it reads before appending).
func TestAnAckIsShownBeforeItsCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		clock := &trapClock{trapped: make(chan struct{}), release: make(chan struct{})}
		b := newBroker(t, Config{Clock: clock})
		// MaxAge makes the producer read the clock each time it looks for room.
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 1, MaxAge: time.Hour, BlockTimeout: time.Hour}})
		release := make(chan struct{})
		g := subscribe(t, b, "orders", "billing", "b1", stuckHandler(release))
		publish(t, orders, "", "first")
		published, drained := make(chan error, 1), make(chan error, 1)
		go func() { published <- second(orders.Publish(ctx, nil, []byte("second"), nil)) }()
		go func() { drained <- b.Drain(ctx) }()
		synctest.Wait() // the handler holds "first"; the producer waits for room, Drain for progress

		clock.arm()
		b.progressMu.Lock() // the worker, once it has committed, waits here to wake Drain
		close(release)
		<-clock.trapped // the commit woke the producer, which reads the clock before appending
		delivered, state, committed := g.Stats().Delivered, g.DeliveryState(0), g.Committed(0)
		b.progressMu.Unlock()
		close(clock.release)
		if committed != 1 || delivered != 1 || state != Acked {
			t.Errorf("once committed %d: delivered %d, state %v; want 1 delivered, acked", committed, delivered, state)
		}
		if err := <-published; err != nil {
			t.Fatalf("second publish: %v", err)
		}
		if err := <-drained; err != nil {
			t.Fatalf("Drain: %v", err)
		}
	})
}

func TestGracefulShutdownThenClosedErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var h recorder
		var left sync.WaitGroup
		left.Add(1)
		if _, err := b.Subscribe("orders", "billing", "b1", h.handler("b1"), left.Done, GroupSpec{}); err != nil {
			t.Fatal(err)
		}
		for _, v := range values("e", 10) {
			publish(t, orders, "", v)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		left.Wait() // Close told the consumer it left
		if got := sorted(h.acked()); !slices.Equal(got, values("e", 10)) {
			t.Errorf("Close stopped before the drain: acked %v", got)
		}
		if s := b.State(); s != Stopped {
			t.Errorf("state %v, want stopped", s)
		}
		_, err := orders.Publish(context.Background(), nil, []byte("late"), nil)
		wantErr(t, err, ErrClosed)
		_, err = b.Subscribe("orders", "billing", "b2", h.handler("b2"), nil, GroupSpec{})
		wantErr(t, err, ErrClosed)
		_, err = b.CreateTopic("more", TopicSpec{})
		wantErr(t, err, ErrClosed)
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("second Close: %v, want nil (idempotent)", err)
		}
	})
}

// TestCloseWhileAProducerIsBlocked: Close fails a producer parked on a full
// partition at once, before it waits for the groups to drain.
func TestCloseWhileAProducerIsBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 2, BlockTimeout: time.Hour}})
		release := make(chan struct{})
		subscribe(t, b, "orders", "billing", "b1", stuckHandler(release)) // holds "a" until released
		publish(t, orders, "", "a")
		publish(t, orders, "", "b")
		blocked := make(chan error)
		go func() {
			_, err := orders.Publish(context.Background(), nil, []byte("c"), nil)
			blocked <- err
		}()
		synctest.Wait() // the producer is parked on the full partition
		closed := make(chan error)
		go func() { closed <- b.Close(context.Background()) }()
		wantErr(t, <-blocked, ErrClosed) // while Close still waits for billing
		close(release)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if end := orders.Partition(0).End(); end != 2 {
			t.Errorf("end offset %d after Close, want 2: the parked producer must not append", end)
		}
	})
}

func TestPublishHonoursItsContextWhileBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 1, BlockTimeout: time.Hour}})
		release := make(chan struct{})
		defer close(release)
		subscribe(t, b, "orders", "billing", "b1", stuckHandler(release)) // holds "a"
		publish(t, orders, "", "a")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := orders.Publish(ctx, nil, []byte("b"), nil)
		wantErr(t, err, context.DeadlineExceeded)
		if end := orders.Partition(0).End(); end != 1 {
			t.Errorf("end %d, want 1", end)
		}
	})
}

// TestCloseReportsWhatWasLeft: Close's ctx ends while a handler is stuck.
// Close cancels the handlers' context, stops everything, and names the
// partition it could not drain.
func TestCloseReportsWhatWasLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", func(ctx context.Context, d *Delivery) error {
			if d.Partition == 1 {
				<-ctx.Done() // stuck until Close gives up
				return ctx.Err()
			}
			return h.handler("b1")(ctx, d)
		})
		for _, v := range values("e", 4) {
			publish(t, orders, "", v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := b.Close(ctx)
		wantErr(t, err, context.DeadlineExceeded)
		se, ok := errors.AsType[*ShutdownError](err)
		want := []Unfinished{{Group: "billing", Topic: "orders", Partition: 1, Committed: 0, End: 2}}
		if !ok || !slices.Equal(se.Unfinished, want) {
			t.Fatalf("Close error %v, want a ShutdownError naming %+v", err, want)
		}
		if b.State() != Stopped {
			t.Errorf("state %v, want stopped", b.State())
		}
		if got := h.acked(); !slices.Equal(got, []string{"e000", "e002"}) {
			t.Errorf("partition 0 acked %v, want it drained", got)
		}
	})
}

func TestConcurrentCloseIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 4})
		var h recorder
		subscribe(t, b, "orders", "billing", "b1", h.handler("b1"))
		for _, v := range values("e", 40) {
			publish(t, orders, "", v)
		}
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = b.Close(context.Background()) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Close #%d: %v", i, err)
			}
		}
		if len(h.acked()) != 40 || b.State() != Stopped {
			t.Errorf("acked %d of 40, state %v", len(h.acked()), b.State())
		}
	})
}

// TestStopMidBackoffDoesNotCommit: at-least-once. A worker stopped while it
// waits out a backoff leaves the offset uncommitted; the record comes back,
// with its attempt count carried on.
func TestStopMidBackoffDoesNotCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 5, BaseDelay: time.Hour}})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		var h recorder
		h.fail = func(_ *Record, attempt int) error {
			if attempt == 1 {
				return errors.New("transient")
			}
			return nil
		}
		g := subscribe(t, b, "orders", "billing", "c1", h.handler("c1"))
		publish(t, orders, "", "x")
		synctest.Wait()
		if g.DeliveryState(0) != RetryScheduled {
			t.Fatalf("state %v, want retry-scheduled", g.DeliveryState(0))
		}
		mustPause(t, g) // interrupts the hour-long backoff
		if c := g.Committed(0); c != 0 {
			t.Fatalf("committed %d after a stop mid-backoff, want 0", c)
		}
		_ = g.Resume(context.Background())
		drain(t, b)
		calls := h.snapshot()
		if len(calls) != 2 || calls[1].attempt != 2 || calls[1].err != nil {
			t.Errorf("calls %+v, want the record again with attempt 2", calls)
		}
	})
}

func TestInvalidRequests(t *testing.T) {
	b := newBroker(t, Config{})
	mustTopic(t, b, "orders", TopicSpec{})
	nop := func(context.Context, *Delivery) error { return nil }
	_, err := NewBroker(Config{Retry: RetryPolicy{MaxAttempts: -1}})
	wantErr(t, err, ErrInvalid)
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"negative partitions", second(b.CreateTopic("t1", TopicSpec{Partitions: -1})), ErrInvalid},
		{"negative capacity", second(b.CreateTopic("t2", TopicSpec{Retention: Retention{MaxMessages: -1}})), ErrInvalid},
		{"empty topic name", second(b.CreateTopic("", TopicSpec{})), ErrInvalid},
		{"topic twice", second(b.CreateTopic("orders", TopicSpec{})), ErrTopicExists},
		{"unknown topic", second(b.Topic("nope")), ErrTopicNotFound},
		{"subscribe unknown topic", second(b.Subscribe("nope", "g", "c", nop, nil, GroupSpec{})), ErrTopicNotFound},
		{"empty group", second(b.Subscribe("orders", "", "c", nop, nil, GroupSpec{})), ErrSubscription},
		{"empty consumer", second(b.Subscribe("orders", "g", "", nop, nil, GroupSpec{})), ErrSubscription},
		{"nil handler", second(b.Subscribe("orders", "g", "c", nil, nil, GroupSpec{})), ErrSubscription},
		{"negative group retries", second(b.Subscribe("orders", "g", "c", nop, nil, GroupSpec{Retry: RetryPolicy{MaxAttempts: -2}})), ErrInvalid},
		{"negative dead-letter limit other than NoDeadLetters", second(b.Subscribe("orders", "g", "c", nop, nil, GroupSpec{DeadLetterLimit: -2})), ErrInvalid},
		{"unknown group", second(b.Group("nope", "orders")), ErrSubscription},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantErr(t, tt.err, tt.want) })
	}
	// None of the failed subscriptions left a group behind to hold records.
	if _, err := b.Group("g", "orders"); !errors.Is(err, ErrSubscription) {
		t.Errorf("a failed Subscribe created group g: %v", err)
	}
}

func TestDuplicateConsumerName(t *testing.T) {
	b := newBroker(t, Config{})
	mustTopic(t, b, "orders", TopicSpec{})
	nop := func(context.Context, *Delivery) error { return nil }
	subscribe(t, b, "orders", "billing", "b1", nop)
	_, err := b.Subscribe("orders", "billing", "b1", nop, nil, GroupSpec{})
	wantErr(t, err, ErrSubscription)
	g, _ := b.Group("billing", "orders")
	if a := g.Assignment(); len(a) != 1 || len(a["b1"]) != 1 {
		t.Errorf("assignment %v, want b1 alone", a)
	}
}

func second[T any](_ T, err error) error { return err }

// TestReclaimKeepsTheWholeWindow: reclaiming frees one record per append
// that needs room, so a partition whose groups are caught up still holds
// MaxMessages records for a replay to reach.
func TestReclaimKeepsTheWholeWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{})
		orders := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 4}})
		var h recorder
		g := subscribe(t, b, "orders", "g", "c", h.handler("c"))
		for _, v := range values("r", 10) {
			publish(t, orders, "", v)
			drain(t, b)
		}
		if s := orders.Partition(0).Stats(); s.Retained != 4 || s.Reclaimed != 6 {
			t.Fatalf("stats %+v, want the last 4 records retained and 6 reclaimed", s)
		}
		if err := g.Replay(context.Background(), Start{Kind: StartOffset, Offset: 0}); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		if got := h.acked()[10:]; !slices.Equal(got, []string{"r006", "r007", "r008", "r009"}) {
			t.Errorf("replay delivered %v, want the 4 retained records", got)
		}
	})
}

// A dead letter keeps its record's contents after the log has reused the
// record's place, and its memory, for newer records.
func TestDeadLettersOutliveReclaimedRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 1}})
		topic := mustTopic(t, b, "orders", TopicSpec{Retention: Retention{MaxMessages: 2}})
		g := subscribe(t, b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
			rec := d.Record
			if strings.HasPrefix(string(rec.Value), "poison") {
				return ErrPermanent
			}
			return nil
		})
		publish(t, topic, "k", "poison-1")
		for i := range 50 { // many times the partition: every record's place is reused
			publish(t, topic, "k", fmt.Sprintf("ok-%d", i))
		}
		publish(t, topic, "k", "poison-2")
		drain(t, b)
		if st := topic.Stats()[0]; st.Reclaimed < 40 {
			t.Fatalf("only %d records were reclaimed; the test needs the log to reuse records", st.Reclaimed)
		}
		letters := g.DeadLetters()
		if len(letters) != 2 {
			t.Fatalf("got %d dead letters, want 2", len(letters))
		}
		for i, want := range []struct {
			value  string
			offset int64
		}{{"poison-1", 0}, {"poison-2", 51}} {
			rec := letters[i].Record
			if string(rec.Value) != want.value || rec.Offset != want.offset || string(rec.Key) != "k" {
				t.Errorf("dead letter %d holds %q at offset %d key %q, want %q at %d key \"k\"",
					i, rec.Value, rec.Offset, rec.Key, want.value, want.offset)
			}
		}
	})
}

// TestSubscribeRacingCloseLeavesNoGroup: a Subscribe that fails because
// Close began changes nothing. Each round races Subscribes that create new
// groups against Close; a failed one must leave no group registered, and a
// successful one must have registered its group with its consumer. The race
// is real (no synctest), so one round may see any interleaving.
func TestSubscribeRacingCloseLeavesNoGroup(t *testing.T) {
	const rounds, subscribers = 200, 4
	ack := func(context.Context, *Delivery) error { return nil }
	failed := 0
	for range rounds {
		b, err := NewBroker(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.CreateTopic("orders", TopicSpec{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, subscribers)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = b.Subscribe("orders", fmt.Sprintf("g%d", i), "c", ack, nil, GroupSpec{})
			})
		}
		wg.Go(func() {
			if err := b.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		wg.Wait()
		for i, err := range errs {
			g, lookup := b.Group(fmt.Sprintf("g%d", i), "orders")
			switch {
			case err == nil && lookup != nil:
				t.Errorf("g%d: Subscribe succeeded but the group is gone: %v", i, lookup)
			case err == nil && len(g.Assignment()["c"]) != 2:
				t.Errorf("g%d: Subscribe succeeded but assignment is %v", i, g.Assignment())
			case err != nil && !errors.Is(err, ErrClosed):
				t.Errorf("g%d: Subscribe: %v, want ErrClosed", i, err)
			case err != nil && !errors.Is(lookup, ErrSubscription):
				t.Errorf("g%d: Subscribe failed (%v) but left a group behind (lookup: %v)", i, err, lookup)
			}
			if err != nil {
				failed++
			}
		}
	}
	t.Logf("%d of %d Subscribes lost the race to Close", failed, rounds*subscribers)
}
