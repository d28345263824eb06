package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/engine"
)

// eventLog is an Observer that keeps a copy of every event.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) Observe(e *Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := *e
	kept.Record, kept.Letter = nil, nil // valid only during the call
	l.events = append(l.events, kept)
}

// of returns the events of kind, in order.
func (l *eventLog) of(kind engine.EventKind) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// The engine tells its Observer what only it sees, with the fields each
// kind promises.
func TestObserverIsToldOfRetriesDeadLettersAndRebalances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		b := newBroker(t, Config{Observer: &log, Retry: RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}})
		orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 2})
		boom := errors.New("boom")
		g := subscribe(t, b, "orders", "billing", "b1", func(context.Context, *Delivery) error { return boom })
		rec := orders.NewRecord()
		rec.Value = []byte("v")
		if _, err := orders.AppendOne(context.Background(), 1, rec); err != nil {
			t.Fatal(err)
		}
		drain(t, b)

		retries := log.of(engine.EventRetry)
		if len(retries) != 1 {
			t.Fatalf("%d retry events, want 1: %+v", len(retries), retries)
		}
		if r := retries[0]; r.Topic != "orders" || r.Group != "billing" || r.Consumer != "b1" || r.Partition != 1 ||
			r.Offset != 0 || r.Attempt != 1 || r.Delay != time.Second || !errors.Is(r.Err, boom) || r.ID == "" {
			t.Errorf("retry event %+v", r)
		}
		letters := log.of(engine.EventDeadLetter)
		if len(letters) != 1 {
			t.Fatalf("%d dead-letter events, want 1", len(letters))
		}
		if d := letters[0]; d.Topic != "orders" || d.Group != "billing" || d.Partition != 1 || d.Attempt != 2 ||
			d.ID != retries[0].ID || !errors.Is(d.Err, boom) || d.Count != 0 {
			t.Errorf("dead-letter event %+v", d)
		}

		subscribe(t, b, "orders", "billing", "b2", func(context.Context, *Delivery) error { return nil })
		if err := g.Leave(context.Background(), "b1"); err != nil {
			t.Fatal(err)
		}
		rebalances := log.of(engine.EventRebalance)
		want := []struct{ before, after map[string][]int }{
			{nil, map[string][]int{"b1": {0, 1}}},
			{map[string][]int{"b1": {0, 1}}, map[string][]int{"b1": {0}, "b2": {1}}},
			{map[string][]int{"b1": {0}, "b2": {1}}, map[string][]int{"b2": {0, 1}}},
		}
		if len(rebalances) != len(want) {
			t.Fatalf("%d rebalance events, want %d: %+v", len(rebalances), len(want), rebalances)
		}
		for i, w := range want {
			r := rebalances[i]
			if r.Group != "billing" || r.Topic != "orders" || !sameAssignment(r.Before, w.before) || !sameAssignment(r.After, w.after) {
				t.Errorf("rebalance %d: %v → %v, want %v → %v", i, r.Before, r.After, w.before, w.after)
			}
		}
	})
}

func sameAssignment(a, b map[string][]int) bool {
	return len(a) == len(b) && maps.EqualFunc(a, b, slices.Equal[[]int])
}

// A Block producer that waits is reported when it begins to wait and when
// it gives up; DropOldest and MaxAge report what they trimmed, and a group
// that finds records gone reports the skip.
func TestObserverIsToldOfBackpressureDropsExpiriesAndSkips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		b := newBroker(t, Config{Observer: &log})
		ctx := context.Background()

		blocked := mustTopic(t, b, "blocked", TopicSpec{Retention: Retention{MaxMessages: 1, BlockTimeout: time.Second}})
		slow := subscribe(t, b, "blocked", "slow", "s1", func(context.Context, *Delivery) error { return nil })
		mustPause(t, slow)
		publish(t, blocked, "", "fits")
		if _, err := blocked.Publish(ctx, nil, []byte("waits"), nil); !errors.Is(err, ErrBackpressure) {
			t.Fatalf("second publish: %v, want ErrBackpressure", err)
		}
		waits, timeouts := log.of(engine.EventBackpressureWait), log.of(engine.EventBackpressureTimeout)
		if len(waits) != 1 || waits[0].Topic != "blocked" || waits[0].Partition != 0 {
			t.Errorf("wait events %+v, want one for blocked/0", waits)
		}
		if len(timeouts) != 1 || timeouts[0].Delay != time.Second || !errors.Is(timeouts[0].Err, ErrBackpressure) {
			t.Errorf("timeout events %+v, want one after 1s wrapping ErrBackpressure", timeouts)
		}
		if err := slow.Resume(ctx); err != nil {
			t.Fatal(err)
		}

		shed := mustTopic(t, b, "shed", TopicSpec{Retention: Retention{MaxMessages: 2, OnFull: DropOldest}})
		g := subscribe(t, b, "shed", "late", "l1", func(context.Context, *Delivery) error { return nil })
		mustPause(t, g)
		for i := range 5 {
			publish(t, shed, "", fmt.Sprint(i))
		}
		var dropped int64
		for _, e := range log.of(engine.EventDrop) {
			if e.Topic == "shed" {
				dropped += e.Count
			}
		}
		if dropped != 3 {
			t.Errorf("drop events count %d records, want 3", dropped)
		}
		if err := g.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		drain(t, b)
		skips := log.of(engine.EventSkip)
		if len(skips) != 1 || skips[0].Group != "late" || skips[0].Offset != 0 || skips[0].To != 3 {
			t.Errorf("skip events %+v, want late skipping [0, 3)", skips)
		}

		aging := mustTopic(t, b, "aging", TopicSpec{Retention: Retention{MaxAge: time.Minute}})
		publish(t, aging, "", "old")
		time.Sleep(2 * time.Minute) // virtual time: the record ages past MaxAge
		publish(t, aging, "", "new")
		time.Sleep(2 * time.Minute)
		publish(t, aging, "", "newer") // expires "new": the count is of this trim only
		expired := log.of(engine.EventExpire)
		if len(expired) != 2 || expired[0].Topic != "aging" || expired[0].Count != 1 || expired[1].Count != 1 {
			t.Errorf("expire events %+v, want two of 1 record each on aging", expired)
		}
		// A lock that trimmed nothing raises nothing.
		for _, e := range append(log.of(engine.EventDrop), expired...) {
			if e.Count <= 0 {
				t.Errorf("event %+v counts no record", e)
			}
		}
	})
}
