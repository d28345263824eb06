package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
)

// history records every handler call of a group across brokers, and fails
// the test when two calls for one partition overlap.
type history struct {
	t    *testing.T
	busy [8]atomic.Int32

	mu    sync.Mutex
	calls map[string][]call // by value
	order [8][]string       // consumers in the order they handled each partition
	done  map[string]bool
	n     int
	more  chan struct{} // closed and replaced when a value is handled for the first time
}

type call struct {
	consumer  string
	partition int
	attempt   int
}

func newHistory(t *testing.T) *history {
	return &history{t: t, calls: map[string][]call{}, done: map[string]bool{}, more: make(chan struct{})}
}

func (h *history) handler(consumer string) pubsub.HandlerFunc[string] {
	return func(_ context.Context, m pubsub.Message[string]) error {
		if h.busy[m.Partition].Add(1) != 1 {
			h.t.Errorf("%s: partition %d handled by two consumers at once", consumer, m.Partition)
		}
		defer h.busy[m.Partition].Add(-1)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.calls[m.Value] = append(h.calls[m.Value], call{consumer, m.Partition, m.Attempt})
		h.order[m.Partition] = append(h.order[m.Partition], consumer)
		if !h.done[m.Value] {
			h.done[m.Value] = true
			h.n++
			close(h.more)
			h.more = make(chan struct{})
		}
		return nil
	}
}

// checkHandoffs fails the test when a partition went back to a consumer
// that had handed it over: ownership moves once per rebalance, it does
// not alternate.
func (h *history) checkHandoffs() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, order := range h.order {
		left := map[string]bool{}
		for i := 1; i < len(order); i++ {
			if order[i] != order[i-1] {
				left[order[i-1]] = true
				if left[order[i]] {
					h.t.Errorf("partition %d went back to %s after it handed it over", p, order[i])
				}
			}
		}
	}
}

// waitFor waits until n distinct values were handled, or ctx ends.
func (h *history) waitFor(ctx context.Context, n int) error {
	for {
		h.mu.Lock()
		got, more := h.n, h.more
		h.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-more:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d values handled: %w", got, n, ctx.Err())
		}
	}
}

// TestTwoBrokersShareAGroup runs one group over two brokers, each on its
// own connection to the server, as two processes would: ownership is
// exclusive and balanced, a clean join redelivers nothing, and when one
// broker's connection dies the other takes over its partitions with
// nothing lost and every repeat explained by its attempt number.
func TestTwoBrokersShareAGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := testOptions()
	conn := func() *nats.Conn {
		nc, err := testServer.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc1, nc2 := conn(), conn()
	e1, err := Connect(nc1, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := Connect(nc2, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := brokerOn(t, e1), brokerOn(t, e2)
	topic := func(b *pubsub.Broker) *pubsub.Topic[string, string] {
		tp, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(4))
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	t1, t2 := topic(b1), topic(b2)
	h := newHistory(t)
	g1, err := t1.Subscribe("billing", "c1", h.handler("c1"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := t2.Subscribe("billing", "c2", h.handler("c2"))
	if err != nil {
		t.Fatal(err)
	}
	asg := g2.Assignment()
	if len(asg["c1"]) != 2 || len(asg["c2"]) != 2 {
		t.Errorf("assignment %v, want two partitions each", asg)
	}
	waitAgree(ctx, t, g1, g2)
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := t1.Publish(ctx, fmt.Sprint("key-", i%16), fmt.Sprint("v", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 200)
	if err := h.waitFor(ctx, 200); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	for v, calls := range h.calls {
		if len(calls) != 1 {
			t.Errorf("%s handled %d times after a clean join, want once: %+v", v, len(calls), calls)
		}
	}
	h.mu.Unlock()
	h.checkHandoffs()

	// c2's process dies: its connection closes without a goodbye.
	nc2.Close()
	crashed := time.Now()
	publish(200, 300)
	if err := h.waitFor(ctx, 300); err != nil {
		t.Fatal(err)
	}
	t.Logf("all records handled %v after c2's connection closed (MemberTTL 1s, AckWait 2s)", time.Since(crashed))
	if err := b1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for v, calls := range h.calls {
		for i := 1; i < len(calls); i++ {
			if calls[i].attempt <= calls[i-1].attempt {
				t.Errorf("%s handled again with attempt %d after attempt %d: an unexplained redelivery (%+v)",
					v, calls[i].attempt, calls[i-1].attempt, calls)
			}
		}
	}
	if asg := g1.Assignment(); len(asg["c1"]) != 4 {
		t.Errorf("assignment after c2 died: %v, want c1 to own all 4", asg)
	}
}

// TestPauseAndResumeAcrossBrokers pauses a group from one broker and
// resumes it from the other: the pause stops both (it is the server's),
// and the resume releases the broker that paused, too.
func TestPauseAndResumeAcrossBrokers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	b1, b2 := brokerOn(t, testServer.Engine(opts...)), brokerOn(t, testServer.Engine(opts...))
	topic := func(b *pubsub.Broker) *pubsub.Topic[string, string] {
		tp, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	t1, t2 := topic(b1), topic(b2)
	h := newHistory(t)
	g1, err := t1.Subscribe("billing", "c1", h.handler("c1"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := t2.Subscribe("billing", "c2", h.handler("c2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := t2.Publish(ctx, fmt.Sprint("key-", i), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b2.Drain(ctx); !errors.Is(err, pubsub.ErrStalled) {
		t.Errorf("Drain of the other broker while paused: got %v, want ErrStalled", err)
	}
	if lag := g2.Lag(); lag != 20 {
		t.Errorf("Lag while paused: %d, want 20", lag)
	}
	if err := g2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.waitFor(ctx, 20); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*pubsub.Broker{b1, b2} {
		if err := b.Drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	byConsumer := map[string]int{}
	for _, calls := range h.calls {
		byConsumer[calls[0].consumer]++
	}
	if byConsumer["c1"] == 0 || byConsumer["c2"] == 0 {
		t.Errorf("handled by %v, want both brokers to resume (the one that paused included)", byConsumer)
	}
}

// waitAgree waits until the groups (one per broker) report the same
// assignment. Each broker learns of the others' joins from the server (a
// watch, so within milliseconds); nothing local can signal it, so this
// looks at the views themselves, every 5ms.
func waitAgree(ctx context.Context, t *testing.T, gs ...*pubsub.Group[string]) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		want, same := fmt.Sprint(gs[0].Assignment()), true
		for _, g := range gs[1:] {
			same = same && fmt.Sprint(g.Assignment()) == want
		}
		if same {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the brokers' assignments never agreed: %v", want)
		}
	}
}

// TestCleanLeaveAcrossBrokersRedeliversNothing runs a group of three
// brokers over 6 partitions, balanced two each, and closes one of them
// while records flow: its partitions move to the other two, every record
// is handled exactly once at attempt 1, and no partition goes back to a
// consumer that handed it over.
func TestCleanLeaveAcrossBrokersRedeliversNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := testOptions()
	h := newHistory(t)
	var topics []*pubsub.Topic[string, string]
	var groups []*pubsub.Group[string]
	var brokers []*pubsub.Broker
	for i := range 3 {
		b := brokerOn(t, testServer.Engine(opts...))
		tp, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(6))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprint("c", i+1)
		g, err := tp.Subscribe("billing", name, h.handler(name))
		if err != nil {
			t.Fatal(err)
		}
		brokers, topics, groups = append(brokers, b), append(topics, tp), append(groups, g)
	}
	waitAgree(ctx, t, groups...)
	for name, ps := range groups[0].Assignment() {
		if len(ps) != 2 {
			t.Errorf("%s owns %v, want two of the six partitions", name, ps)
		}
	}
	const n = 600
	published := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := topics[0].Publish(ctx, fmt.Sprint("key-", i%24), fmt.Sprint("v", i)); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()
	if err := h.waitFor(ctx, n/3); err != nil {
		t.Fatal(err)
	}
	if err := brokers[2].Close(ctx); err != nil { // c3 leaves cleanly, mid-stream
		t.Fatalf("Close of c3's broker: %v", err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if err := h.waitFor(ctx, n); err != nil {
		t.Fatal(err)
	}
	for _, b := range brokers[:2] {
		if err := b.Drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	for v, calls := range h.calls {
		if len(calls) != 1 || calls[0].attempt != 1 {
			t.Errorf("%s: %+v, want one call at attempt 1 (a clean leave redelivers nothing)", v, calls)
		}
	}
	h.mu.Unlock()
	// No handoff check here: c3's partitions go back to whichever of c1
	// and c2 had them before c3 joined (the worker that hands a partition
	// over finishes the record its last pull brought, so c1 or c2 may
	// have handled one of them after the join). Overlap is checked on
	// every call (busy).
	if asg := groups[0].Assignment(); len(asg) != 2 || len(asg["c1"]) != 3 || len(asg["c2"]) != 3 {
		t.Errorf("assignment after c3 left: %v, want c1 and c2 with three each", asg)
	}
}
