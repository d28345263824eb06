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
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TestBatchUnderBlockStoresAPrefix publishes a batch larger than a Block
// partition's room while its only group is paused: the batch stores what
// fits, in order, fails with ErrBackpressure, and the partition holds
// exactly that prefix (nothing after it, nothing twice).
func TestBatchUnderBlockStoresAPrefix(t *testing.T) {
	b := newBroker(t)
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, BlockTimeout: 50 * time.Millisecond}))
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
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	var batch []string
	for i := range 6 {
		batch = append(batch, fmt.Sprint("v", i))
	}
	pos, err := topic.PublishValues(ctx, batch)
	if !errors.Is(err, pubsub.ErrBackpressure) {
		t.Fatalf("PublishValues of 6 into room for 4: got %v, want ErrBackpressure", err)
	}
	if len(pos) != 4 {
		t.Errorf("positions %v, want the 4 stored", pos)
	}
	for i, p := range pos {
		if p.Offset != int64(i) {
			t.Errorf("record %d stored at offset %d, want %d", i, p.Offset, i)
		}
	}
	if st := topic.Stats(); st.Published != 4 || st.Retained != 4 || st.TimedOut != 1 {
		t.Errorf("stats %+v, want 4 published and retained, 1 timed out", st)
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.Values(); fmt.Sprint(got) != fmt.Sprint(batch[:4]) {
		t.Errorf("delivered %q, want %q", got, batch[:4])
	}
}

// consumerOf returns the server's view of group's consumer on partition p
// of topic, for a broker made with opts.
func consumerOf(t *testing.T, opts []Option, topic, group string, p int) *natsjs.ConsumerInfo {
	t.Helper()
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	n := names{prefix: encodeName(c.prefix)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, n.stream(topic, p), n.consumer(group, p))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestBatchThenRecordConsumerKeepsOrderUnderRetry: a batch consumer raises
// its partition's MaxAckPending to its batch size; a per-record consumer
// that takes the partition after it sets it back to one, so a record
// waiting out its backoff still holds back the one behind it.
func TestBatchThenRecordConsumerKeepsOrderUnderRetry(t *testing.T) {
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...), pubsub.WithRetry(pubsub.RetryPolicy{BaseDelay: 100 * time.Millisecond}))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	batches := &batchRecorder{}
	g, err := topic.SubscribeBatch("g", "b1", batches, pubsub.WithBatchSize(8))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValues(ctx, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := consumerOf(t, opts, "orders", "g", 0).Config.MaxAckPending; got != 8 {
		t.Errorf("MaxAckPending under a batch consumer: %d, want 8", got)
	}
	if err := g.Leave(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	rec := pubsubtest.NewRecorder[string]()
	rec.FailWith(func(m pubsub.Message[string]) error {
		if m.Value == "bad" && m.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	})
	if _, err := topic.Subscribe("g", "r1", rec); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.PublishValues(ctx, []string{"bad", "next"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.Values(); fmt.Sprint(got) != "[bad next]" || rec.Calls() != 3 {
		t.Errorf("per-record consumer acked %q in %d calls, want bad (its second attempt), then next, in 3 calls", got, rec.Calls())
	}
	if got := consumerOf(t, opts, "orders", "g", 0).Config.MaxAckPending; got != 1 {
		t.Errorf("MaxAckPending under a per-record consumer: %d, want 1", got)
	}
	if got := batches.values(); fmt.Sprint(got) != "[a b c]" {
		t.Errorf("batch consumer got %q, want [a b c]", got)
	}
}

// TestBatchKeepsHeldRecordsAlivePastAckWait: the records after a failed
// one wait, unacked, while it waits out a backoff longer than AckWait;
// the worker keeps them alive, so they come once, on their first attempt,
// after the failed one.
func TestBatchKeepsHeldRecordsAlivePastAckWait(t *testing.T) {
	b := brokerOn(t, testServer.Engine(testOptions(WithAckWait(300*time.Millisecond))...),
		pubsub.WithRetry(pubsub.RetryPolicy{BaseDelay: time.Second}))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValues(ctx, []string{"a", "bad", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	batches := &batchRecorder{fail: func(msgs []pubsub.Message[string]) error {
		for i, m := range msgs {
			if m.Value == "bad" && m.Attempt == 1 {
				return &pubsub.BatchError{Index: i, Err: errors.New("not yet")}
			}
		}
		return nil
	}}
	g, err := topic.SubscribeBatch("g", "b1", batches)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, call := range batches.all() {
		for _, m := range call {
			seen = append(seen, fmt.Sprintf("%s/%d", m.Value, m.Attempt))
		}
	}
	if fmt.Sprint(seen) != "[a/1 bad/1 b/1 c/1 bad/2 b/1 c/1]" && fmt.Sprint(seen) != "[a/1 bad/1 bad/2 b/1 c/1]" {
		t.Errorf("delivered %v, want a, bad failing, bad again, then b and c on their first attempt", seen)
	}
	if st := g.Stats(); st.Delivered != 4 || st.Retried != 1 {
		t.Errorf("stats %+v, want 4 delivered, 1 retried", st)
	}
}

// batchRecorder is a batch handler that keeps every call.
type batchRecorder struct {
	mu    sync.Mutex
	calls [][]pubsub.Message[string]
	fail  func([]pubsub.Message[string]) error
}

func (r *batchRecorder) HandleBatch(_ context.Context, msgs []pubsub.Message[string]) error {
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(msgs))
	r.mu.Unlock()
	if r.fail != nil {
		return r.fail(msgs)
	}
	return nil
}

func (r *batchRecorder) all() [][]pubsub.Message[string] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *batchRecorder) values() []string {
	var out []string
	for _, call := range r.all() {
		for _, m := range call {
			out = append(out, m.Value)
		}
	}
	return out
}

// A batch consumer's pull for a whole batch (1024 records) is answered in
// a burst: every record must reach the worker, none dropped by the client
// for want of buffer (a slow consumer), which would bring it again only
// after AckWait, with Attempt 2.
func TestBatchPullsLoseNoRecord(t *testing.T) {
	const size, total = 1024, 3000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, topic := backlog(ctx, t, total, func(int) string { return "k" })
	var mu sync.Mutex
	var handled, again int
	g, err := topic.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			handled++
			if m.Attempt != 1 {
				again++
			}
		}
		return nil
	}), pubsub.WithBatchSize(size), pubsub.StartAt(pubsub.Earliest()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if handled != total || again != 0 || g.Committed(0) != total {
		t.Errorf("%d handled, %d of them again, committed %d; want %d handled once each, all committed", handled, again, g.Committed(0), total)
	}
}
