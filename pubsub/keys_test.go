package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// WithKeyConcurrency above 1 needs an engine that runs a partition's
// deliveries concurrently: on one without the capability it is
// ErrInvalid, naming the option, for Subscribe and Stream alike; 1 is the
// default and needs nothing.
func TestKeyConcurrencyAnEngineCannotKeepIsErrInvalid(t *testing.T) {
	b := pubsub.NewBroker(pubsub.WithEngine(lesser{engine.AllCapabilities &^ engine.KeyConcurrency}))
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	topic := mustTopic(t, b, "t", codec.String(), codec.String())
	h := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
	_, err := topic.Subscribe("g", "c1", h, pubsub.WithKeyConcurrency(2))
	wantErrIs(t, "Subscribe", err, pubsub.ErrInvalid)
	if err == nil || !strings.Contains(err.Error(), "WithKeyConcurrency(2)") {
		t.Errorf("Subscribe: %v, want it to name WithKeyConcurrency(2)", err)
	}
	_, err = topic.Stream("g", "c1", pubsub.WithKeyConcurrency(2))
	wantErrIs(t, "Stream", err, pubsub.ErrInvalid)
	if _, err := topic.Subscribe("g", "c1", h, pubsub.WithKeyConcurrency(1)); err != nil {
		t.Errorf("Subscribe with WithKeyConcurrency(1): %v", err)
	}
}

// A handler that publishes into its own group's full partition waits for
// itself when its record is the oldest unsettled one, which the group
// commits only once the handler returned: Publish fails at once with
// ErrBackpressure, as without key concurrency. A handler of a later record
// does not: the oldest one settles meanwhile, the commit frees room, and
// its publish goes through without waiting out BlockTimeout.
func TestKeyedHandlerPublishingIntoItsOwnFullPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Hour
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: timeout}))
		type result struct {
			err    error
			waited time.Duration
		}
		results := make(map[string]chan result)
		for _, v := range []string{"first", "second"} {
			results[v] = make(chan result, 1)
		}
		secondWaits := make(chan struct{})
		if _, err := topic.Publish(context.Background(), "a", "first"); err != nil {
			t.Fatal(err)
		}
		if _, err := topic.Publish(context.Background(), "b", "second"); err != nil {
			t.Fatal(err)
		}
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
			switch m.Value {
			case "first":
				<-secondWaits // "second" waits for room: "first" holds the partition
				start := time.Now()
				_, err := topic.Publish(ctx, "c", "from first")
				results["first"] <- result{err, time.Since(start)}
				return nil
			case "second":
				start := time.Now()
				go func() { // exits after a second of virtual time, telling first that second waits
					time.Sleep(time.Second) // virtual: second is parked by then
					close(secondWaits)
				}()
				_, err := topic.Publish(ctx, "d", "from second")
				results["second"] <- result{err, time.Since(start)}
			}
			return nil
		}), pubsub.WithKeyConcurrency(2))
		first := <-results["first"]
		if !errors.Is(first.err, pubsub.ErrBackpressure) || first.waited != 0 {
			t.Errorf("publishing from the oldest record's handler: %v after %v, want ErrBackpressure at once", first.err, first.waited)
		}
		second := <-results["second"]
		if second.err != nil || second.waited >= timeout {
			t.Errorf("publishing from a later record's handler: %v after %v, want it stored once the oldest settled", second.err, second.waited)
		}
	})
}

// With key concurrency, every message's Key is its own copy, as without:
// deliveries of one partition run at once, so they cannot share the
// partition's arena (under -race, sharing it is a data race here).
func TestKeyedMessagesOwnTheirKeys(t *testing.T) {
	b := pubsubtest.NewBroker(t)
	topic := mustTopic(t, b, "orders", codec.String(), codec.String())
	var mu sync.Mutex
	seen := map[string]int{}
	mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		key := string(m.Key)
		m.Key[0] = 'X' // the handler's own: changes nothing for anyone else
		mu.Lock()
		seen[key]++
		mu.Unlock()
		return nil
	}), pubsub.WithKeyConcurrency(16))
	for i := range 2000 {
		if _, err := topic.Publish(context.Background(), fmt.Sprintf("k%02d", i%64), "v"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 64 {
		t.Errorf("saw %d keys, want 64: %v", len(seen), seen)
	}
}
