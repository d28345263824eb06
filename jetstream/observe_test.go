package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// trimHooks writes down the engine's retention and backpressure events.
type trimHooks struct {
	mu     sync.Mutex
	lines  []string
	drops  int64
	waited time.Duration
	err    error
}

func (h *trimHooks) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

func (h *trimHooks) OnDrop(e pubsub.TrimEvent) {
	h.mu.Lock()
	h.drops += e.Count
	h.mu.Unlock()
}

func (h *trimHooks) OnSkip(e pubsub.SkipEvent) {
	h.add("skip %s/%d %s [%d, %d)", e.Topic, e.Partition, e.Group, e.From, e.To)
}

func (h *trimHooks) OnBackpressure(e pubsub.BackpressureEvent) {
	if e.Err == nil {
		h.add("wait %s/%d", e.Topic, e.Partition)
		return
	}
	h.add("timeout %s/%d", e.Topic, e.Partition)
	h.mu.Lock()
	h.waited, h.err = e.Waited, e.Err
	h.mu.Unlock()
}

func (h *trimHooks) all() ([]string, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines), h.drops
}

// TestEventsOfDropOldest: the server's discard-old evictions are reported
// as drops (told from the sequences stored, not asked of the server), and
// a group that finds records gone reports the skip.
func TestEventsOfDropOldest(t *testing.T) {
	h := &trimHooks{}
	b := newBroker(t, pubsub.WithHooks(h))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 3, OnFull: pubsub.DropOldest}))
	if err != nil {
		t.Fatal(err)
	}
	rec := pubsubtest.NewRecorder[string]()
	g, err := topic.Subscribe("g", "c1", rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValue(ctx, "v0"); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// v1..v3 single, v4 and v5 in one batch: 6 records in room for 3.
	for _, v := range []string{"v1", "v2", "v3"} {
		if _, err := topic.PublishValue(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := topic.PublishValues(ctx, []string{"v4", "v5"}); err != nil {
		t.Fatal(err)
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	lines, drops := h.all()
	if drops != 3 || topic.Stats().Dropped != 3 {
		t.Errorf("drop events counted %d, stats %d; want 3", drops, topic.Stats().Dropped)
	}
	if want := []string{"skip orders/0 g [1, 3)"}; !slices.Equal(lines, want) {
		t.Errorf("events %q, want %q", lines, want)
	}
	if got := rec.Values(); !slices.Equal(got, []string{"v0", "v3", "v4", "v5"}) {
		t.Errorf("delivered %q, want v0 then the 3 retained", got)
	}
}

// TestEventsOfBlock: a publisher that finds its Block partition full
// reports that it waits, then that it gave up, with how long it waited.
func TestEventsOfBlock(t *testing.T) {
	const timeout = 60 * time.Millisecond
	h := &trimHooks{}
	b := newBroker(t, pubsub.WithHooks(h))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: timeout}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := topic.Subscribe("g", "c1", pubsubtest.NewRecorder[string]())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.PublishValue(ctx, "v0"); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.PublishValue(ctx, "v1"); !errors.Is(err, pubsub.ErrBackpressure) {
		t.Fatalf("publish into a full partition: %v, want ErrBackpressure", err)
	}
	lines, _ := h.all()
	if want := []string{"wait orders/0", "timeout orders/0"}; !slices.Equal(lines, want) {
		t.Errorf("events %q, want %q", lines, want)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waited < timeout || !errors.Is(h.err, pubsub.ErrBackpressure) {
		t.Errorf("timeout event waited %v with %v, want at least %v and ErrBackpressure", h.waited, h.err, timeout)
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}

// reentrantHooks read the broker from inside the engine's events.
type reentrantHooks struct {
	b                   *pubsub.Broker
	mu                  sync.Mutex
	rebalances, retries int
	sawRetrying         bool
}

func (h *reentrantHooks) OnRebalance(pubsub.RebalanceEvent) {
	_ = h.b.Snapshot()
	h.mu.Lock()
	h.rebalances++
	h.mu.Unlock()
}

func (h *reentrantHooks) OnRetry(e pubsub.RetryEvent) {
	p := h.b.Snapshot().Topics[0].Groups[0].Partitions[e.Delivery.Partition]
	h.mu.Lock()
	h.retries++
	h.sawRetrying = h.sawRetrying || p.Retrying
	h.mu.Unlock()
}

// TestEventsRaisedOutsideLocks: hooks that read the broker's Snapshot from
// inside a rebalance and a retry (from a batch consumer too) do not
// deadlock the engine, and the retry hook already sees the record
// Retrying.
func TestEventsRaisedOutsideLocks(t *testing.T) {
	h := &reentrantHooks{}
	b := newBroker(t, pubsub.WithHooks(h), pubsub.WithRetry(pubsub.RetryPolicy{BaseDelay: time.Millisecond}))
	h.b = b
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.SubscribeBatch("g", "c1", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
		for i, m := range msgs {
			if m.Value == "bad" && m.Attempt == 1 {
				return &pubsub.BatchError{Index: i, Err: errors.New("not yet")}
			}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValues(ctx, []string{"a", "bad", "b"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rebalances != 1 || h.retries != 1 || !h.sawRetrying {
		t.Errorf("%d rebalances, %d retries (Retrying seen: %v); want 1, 1, true", h.rebalances, h.retries, h.sawRetrying)
	}
}
