package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go/jetstream"
)

// The engine called directly, without the typed layer's checks, takes key
// concurrency for a handler, and refuses it for a batch consumer
// (ErrInvalid): a batch is already a unit of concurrency.
func TestEngineKeyConcurrencyRefusedForBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := openEngine(t, testOptions())
	if _, err := e.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *engine.Delivery) error { return nil }
	if _, err := e.Subscribe(ctx, "orders", "billing", "a", h, nil, engine.GroupSpec{KeyConcurrency: 4}); err != nil {
		t.Errorf("Subscribe with KeyConcurrency 4: %v", err)
	}
	bh := func(context.Context, *engine.Batch) error { return nil }
	if _, err := e.SubscribeBatch(ctx, "orders", "batches", "a", bh, nil, engine.GroupSpec{KeyConcurrency: 2}, engine.BatchSpec{}); !errors.Is(err, engine.ErrInvalid) {
		t.Errorf("SubscribeBatch with KeyConcurrency 2: %v, want ErrInvalid", err)
	}
}

// keyRecorder records the calls of a key-concurrency handler: the values
// begun, in order, with their attempts, and the values acked; block, when
// it returns a channel for a message, holds that call until the channel
// closes; fail decides an error.
type keyRecorder struct {
	mu      sync.Mutex
	began   []string // "value attempt n"
	offsets []int64  // of the calls begun
	acked   int
	changed chan struct{}
	block   func(m pubsub.Message[string]) <-chan struct{}
	fail    func(m pubsub.Message[string]) error
}

func newKeyRecorder() *keyRecorder { return &keyRecorder{changed: make(chan struct{})} }

func (r *keyRecorder) Handle(ctx context.Context, m pubsub.Message[string]) error {
	r.mu.Lock()
	r.began = append(r.began, fmt.Sprintf("%s attempt %d", m.Value, m.Attempt))
	r.offsets = append(r.offsets, m.Offset)
	r.signalLocked()
	r.mu.Unlock()
	if r.block != nil {
		if ch := r.block(m); ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	var err error
	if r.fail != nil {
		err = r.fail(m)
	}
	r.mu.Lock()
	if err == nil {
		r.acked++
	}
	r.signalLocked()
	r.mu.Unlock()
	return err
}

func (r *keyRecorder) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// await waits until cond, read under r.mu, holds, or fails the test when
// ctx ends.
func (r *keyRecorder) await(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for {
		r.mu.Lock()
		ok, ch := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("%s: did not happen (%d calls began, %d acked)", what, len(r.began), r.acked)
		}
	}
}

// One slow record at the oldest offset holds the window: the server
// delivers no record more than the window's size past it (the consumer
// allows that many unacked, and the worker asks for no more than the
// window has room for), and once it settles the rest follows.
func TestKeyWindowBoundsWhatTheServerDelivers(t *testing.T) {
	const n, total = 2, 100
	size := engine.KeyWindowSize(n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	rec := newKeyRecorder()
	rec.block = func(m pubsub.Message[string]) <-chan struct{} {
		if m.Value == "slow" {
			return release
		}
		return nil
	}
	g, err := topic.Subscribe("billing", "b1", rec, pubsub.WithKeyConcurrency(n))
	if err != nil {
		t.Fatal(err)
	}
	entries := []pubsub.Entry[string, string]{{Key: "slow", Value: "slow"}}
	for i := 1; i < total; i++ {
		entries = append(entries, pubsub.Entry[string, string]{Key: fmt.Sprint("k", i), Value: fmt.Sprint("v", i)})
	}
	if _, err := topic.PublishBatch(ctx, entries); err != nil {
		t.Fatal(err)
	}
	rec.await(ctx, t, "the window's records but the slow one acked", func() bool { return rec.acked == size-1 })
	// What the server says settles it without waiting for more to come:
	// it delivered the window's size, the rest waits, and no pull of the
	// worker's is open to take it (the worker asks for no more than the
	// window has room for, none while offset 0 is unsettled).
	info := consumerOf(t, opts, "orders", "billing", 0)
	if info.Config.MaxAckPending != size || info.Delivered.Stream != uint64(size) || info.AckFloor.Stream != 0 ||
		info.NumPending != uint64(total-size) || info.NumWaiting != 0 {
		t.Errorf("consumer: MaxAckPending %d, delivered up to %d, ack floor %d, %d waiting, %d pulls open; want %d, %d, 0, %d, 0",
			info.Config.MaxAckPending, info.Delivered.Stream, info.AckFloor.Stream, info.NumPending, info.NumWaiting, size, size, total-size)
	}
	rec.mu.Lock()
	if last := slices.Max(rec.offsets); last != int64(size-1) || rec.acked != size-1 {
		t.Errorf("with offset 0 unsettled: offsets up to %d began and %d were acked, want up to %d and %d", last, rec.acked, size-1, size-1)
	}
	rec.mu.Unlock()
	if p := b.Snapshot().Topics[0].Groups[0].Partitions[0]; p.OldestUnsettled != 0 || p.Running != 1 || p.Committed != 0 {
		t.Errorf("snapshot %+v: want offset 0 the oldest unsettled, 1 running, committed 0", p)
	}
	close(release)
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := g.Committed(0); got != total {
		t.Errorf("Committed(0): got %d, want %d", got, total)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.began) != total || rec.acked != total {
		t.Errorf("%d calls, %d acked, want %d each, once", len(rec.began), rec.acked, total)
	}
}

// A member taking over a partition from one that leaves with records of
// its window unsettled keeps each key's order: the record waiting out its
// backoff comes first, retried at once (Attempt 2), then the record of its
// key that waited behind it, and nothing the first member settled. A
// member of the same broker goes on with the window itself: the waiting
// record comes with Attempt 1, as it was never handled. A member of
// another broker gets the records the first gave back to the server, in
// stream order: the waiting record was delivered once already (Attempt
// 2).
func TestKeyConcurrencyHandOverKeepsKeyOrder(t *testing.T) {
	for _, where := range []string{"same broker", "other broker"} {
		t.Run(where, func(t *testing.T) {
			want := []string{"bad-1 attempt 2", "bad-2 attempt 1"}
			if where == "other broker" {
				want[1] = "bad-2 attempt 2"
			}
			testHandOverKeyOrder(t, where == "other broker", want)
		})
	}
}

func testHandOverKeyOrder(t *testing.T, remote bool, want []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	policy := pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: 10 * time.Second})
	a := brokerOn(t, testServer.Engine(opts...))
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	first := newKeyRecorder()
	first.block = func(m pubsub.Message[string]) <-chan struct{} {
		if m.Value == "slow" {
			return release
		}
		return nil
	}
	first.fail = func(m pubsub.Message[string]) error {
		if m.Value == "bad-1" {
			return errors.New("fails here")
		}
		return nil
	}
	ga, err := ta.Subscribe("billing", "a", first, pubsub.WithKeyConcurrency(4), policy)
	if err != nil {
		t.Fatal(err)
	}
	entries := []pubsub.Entry[string, string]{{Key: "bad", Value: "bad-1"}, {Key: "slow", Value: "slow"}, {Key: "bad", Value: "bad-2"}}
	for i := range 4 {
		entries = append(entries, pubsub.Entry[string, string]{Key: fmt.Sprint("k", i), Value: fmt.Sprint("v", i)})
	}
	if _, err := ta.PublishBatch(ctx, entries); err != nil {
		t.Fatal(err)
	}
	first.await(ctx, t, "bad-1 failed, slow in flight, the others acked", func() bool {
		return len(first.began) == len(entries)-1 && first.acked == len(entries)-3
	})

	b, tb := a, ta
	if remote {
		b = brokerOn(t, testServer.Engine(opts...))
		if tb, err = pubsub.NewTopic(b, "orders", codec.String(), codec.String()); err != nil {
			t.Fatal(err)
		}
	}
	next := newKeyRecorder()
	if _, err := tb.Subscribe("billing", "b", next, pubsub.WithKeyConcurrency(4), policy); err != nil {
		t.Fatal(err)
	}
	left := make(chan error, 1)
	go func() { left <- ga.Leave(ctx, "a") }() // returns once slow ended
	close(release)
	if err := <-left; err != nil {
		t.Fatal(err)
	}
	next.await(ctx, t, "the next member got both records of key bad", func() bool { return next.acked == 2 })
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	next.mu.Lock()
	defer next.mu.Unlock()
	if !slices.Equal(next.began, want) {
		t.Errorf("the next member got %q, want %q", next.began, want)
	}
	if info := consumerOf(t, opts, "orders", "billing", 0); info.AckFloor.Stream != uint64(len(entries)) || info.NumAckPending != 0 {
		t.Errorf("ack floor %d, %d unacked; want %d, none", info.AckFloor.Stream, info.NumAckPending, len(entries))
	}
}

// A group's consumer stored with another MaxAckPending (made by an
// earlier version, or changed by hand) is set to the window's size by the
// worker that takes the partition.
func TestKeyConcurrencyMendsMaxAckPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	a := pubsub.NewBroker(pubsub.WithEngine(testServer.Engine(opts...)))
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Subscribe("billing", "a", newKeyRecorder(), pubsub.WithKeyConcurrency(8)); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	info := consumerOf(t, opts, "orders", "billing", 0)
	if want := engine.KeyWindowSize(8); info.Config.MaxAckPending != want {
		t.Errorf("MaxAckPending %d, want %d", info.Config.MaxAckPending, want)
	}
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cfg := info.Config
	cfg.MaxAckPending = 1
	if _, err := js.UpdateConsumer(ctx, info.Stream, cfg); err != nil {
		t.Fatal(err)
	}

	b := brokerOn(t, testServer.Engine(opts...))
	tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	rec := newKeyRecorder()
	if _, err := tb.Subscribe("billing", "b", rec, pubsub.WithKeyConcurrency(8)); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Publish(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := consumerOf(t, opts, "orders", "billing", 0).Config.MaxAckPending, engine.KeyWindowSize(8); got != want {
		t.Errorf("MaxAckPending once a worker took the partition: %d, want %d", got, want)
	}
}

// A pull for the window's room (256 records at n = 16) is answered in a
// burst: every record must reach the worker, none dropped by the client
// for want of buffer (a slow consumer), which would bring it again only
// after AckWait, with Attempt 2. (With the puller's buffer of 64 and
// pulls for the whole room, most runs lost some.)
func TestKeyWindowPullsLoseNoRecord(t *testing.T) {
	const n, total = 16, 3000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, topic := backlog(ctx, t, total, func(i int) string { return fmt.Sprint("k", i%64) })
	rec := newKeyRecorder()
	g, err := topic.Subscribe("billing", "b1", rec, pubsub.WithKeyConcurrency(n), pubsub.StartAt(pubsub.Earliest()))
	if err != nil {
		t.Fatal(err)
	}
	rec.await(ctx, t, "every record acked", func() bool { return rec.acked == total })
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.began {
		if !strings.HasSuffix(s, " attempt 1") {
			t.Errorf("%s: every record should come once, Attempt 1", s)
		}
	}
	if len(rec.began) != total || g.Committed(0) != total {
		t.Errorf("%d calls, committed %d; want %d each", len(rec.began), g.Committed(0), total)
	}
}

// A broker that crashes (its connection gone without a word) with records
// of its window unsettled: the member of another broker that takes the
// partition over delivers them once the server gives them up (AckWait),
// maybe after records published since; a record that comes back below
// its window runs alone, so no two of one key overlap there, and
// everything is committed in the end.
func TestKeyConcurrencyCrashRedeliversTheWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := testOptions()
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := Connect(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	a := pubsub.NewBroker(pubsub.WithEngine(eng))
	release := make(chan struct{})
	defer func() {
		close(release)
		_ = a.Close(ctx) // its connection is gone: what it left is as last observed
	}()
	ta, err := pubsub.NewTopic(a, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	first := newKeyRecorder()
	first.block = func(m pubsub.Message[string]) <-chan struct{} {
		if m.Value == "s-1" {
			return release
		}
		return nil
	}
	if _, err := ta.Subscribe("billing", "a", first, pubsub.WithKeyConcurrency(4)); err != nil {
		t.Fatal(err)
	}
	entries := []pubsub.Entry[string, string]{{Key: "s", Value: "s-1"}, {Key: "a", Value: "a-1"}, {Key: "s", Value: "s-2"}, {Key: "b", Value: "b-1"}}
	if _, err := ta.PublishBatch(ctx, entries); err != nil {
		t.Fatal(err)
	}
	first.await(ctx, t, "a-1 and b-1 acked, s-1 in flight", func() bool { return first.acked == 2 && len(first.began) == 3 })

	b := brokerOn(t, testServer.Engine(opts...))
	tb, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	busy := map[string]bool{}
	var overlaps []string
	next := newKeyRecorder()
	next.block = func(m pubsub.Message[string]) <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if busy[string(m.Key)] {
			overlaps = append(overlaps, m.Value)
		}
		busy[string(m.Key)] = true
		return nil
	}
	next.fail = func(m pubsub.Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		busy[string(m.Key)] = false
		return nil
	}
	g, err := tb.Subscribe("billing", "b", next, pubsub.WithKeyConcurrency(4))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close() // the crash
	more := []pubsub.Entry[string, string]{{Key: "a", Value: "a-2"}, {Key: "s", Value: "s-3"}}
	if _, err := tb.PublishBatch(ctx, more); err != nil {
		t.Fatal(err)
	}
	next.await(ctx, t, "the crashed broker's unsettled records and the new ones acked", func() bool { return next.acked == 4 })
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := g.Committed(0), int64(len(entries)+len(more)); got != want {
		t.Errorf("Committed(0): got %d, want %d", got, want)
	}
	next.mu.Lock()
	defer next.mu.Unlock()
	// a-2 and s-3 come with Attempt 1, or 2 when the crashed broker's
	// last pull, still open on the server, took them.
	var got []string
	for _, s := range next.began {
		if v := strings.Fields(s)[0]; v == "s-1" || v == "s-2" {
			got = append(got, s)
		} else {
			got = append(got, v)
		}
	}
	if want := []string{"a-2", "s-1 attempt 2", "s-2 attempt 2", "s-3"}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("the next member got %q, want each of %q once", next.began, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("deliveries of one key overlapped: %q", overlaps)
	}
}

// Records retention drops before a key-concurrency group read them are
// counted as skipped, as for one delivery at a time; the records a
// previous owner read (and settled) before this worker took the partition
// are not.
func TestKeyConcurrencyCountsSkips(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := newBroker(t)
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, OnFull: pubsub.DropOldest}))
	if err != nil {
		t.Fatal(err)
	}
	rec := newKeyRecorder()
	g, err := topic.Subscribe("billing", "b1", rec, pubsub.WithKeyConcurrency(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Publish(ctx, "k", "first"); err != nil {
		t.Fatal(err)
	}
	rec.await(ctx, t, "first acked", func() bool { return rec.acked == 1 })
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := topic.Publish(ctx, fmt.Sprint("k", i%3), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if st := g.Stats(); st.Skipped != 6 || st.Delivered != 5 {
		t.Errorf("stats %+v: want 6 skipped (retention kept the last 4 of 10 while paused), 5 delivered", st)
	}
}

// backlog opens a broker whose server gives up on an unacked record only
// after 20 s (so a record that comes again sooner was not lost) and a
// topic holding total records, record i keyed key(i), published before any
// group reads: a group's first pulls are answered at once, in a burst.
func backlog(ctx context.Context, t *testing.T, total int, key func(i int) string) (*pubsub.Broker, *pubsub.Topic[string, string]) {
	t.Helper()
	b := brokerOn(t, testServer.Engine(testOptions(WithAckWait(20*time.Second))...))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 16}))
	if err != nil {
		t.Fatal(err)
	}
	entries := make([]pubsub.Entry[string, string], total)
	for i := range entries {
		entries[i] = pubsub.Entry[string, string]{Key: key(i), Value: fmt.Sprint("v", i)}
	}
	if _, err := topic.PublishBatch(ctx, entries); err != nil {
		t.Fatal(err)
	}
	return b, topic
}
