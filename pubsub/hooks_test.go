package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// events is a hook that implements every Hook interface and writes each
// event down as a line.
type events struct {
	mu    sync.Mutex
	lines []string
	// header is what OnPublish adds to every record.
	header string
}

type ctxKey struct{}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines = append(e.lines, fmt.Sprintf(format, args...))
}

func (e *events) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.lines)
}

// with returns the lines that start with prefix.
func (e *events) with(prefix string) []string {
	var out []string
	for _, l := range e.all() {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (e *events) OnPublish(ctx context.Context, p *pubsub.PublishInfo) context.Context {
	e.add("publish %s/%d key=%s size=%d batch=%d", p.Topic, p.Partition, p.Key, p.Size, p.Batch)
	if e.header != "" {
		if p.Headers == nil {
			p.Headers = map[string]string{}
		}
		p.Headers["trace"] = e.header
	}
	return context.WithValue(ctx, ctxKey{}, "from OnPublish")
}

func (e *events) OnPublished(ctx context.Context, p *pubsub.PublishInfo, pos pubsub.Position, err error) {
	e.add("published %s/%d@%d err=%v ctx=%v", p.Topic, pos.Partition, pos.Offset, err != nil, ctx.Value(ctxKey{}))
}

func (e *events) OnDeliver(ctx context.Context, d *pubsub.DeliveryInfo) context.Context {
	e.add("deliver %s/%s/%d@%d attempt=%d consumer=%s trace=%s", d.Group, d.Topic, d.Partition, d.Offset, d.Attempt, d.Consumer, d.Headers["trace"])
	return context.WithValue(ctx, ctxKey{}, "from OnDeliver")
}

func (e *events) OnDelivered(ctx context.Context, d *pubsub.DeliveryInfo, r pubsub.DeliveryResult) {
	kind := ""
	if _, ok := errors.AsType[*pubsub.PanicError](r.Err); ok {
		kind = " panic"
	}
	e.add("delivered %s@%d attempt=%d %v took=%v%s", d.Group, d.Offset, d.Attempt, r.Outcome, r.Took, kind)
}

func (e *events) OnRetry(r pubsub.RetryEvent) {
	e.add("retry %s@%d attempt=%d delay=%v err=%v", r.Delivery.Group, r.Delivery.Offset, r.Delivery.Attempt, r.Delay, r.Err)
}

func (e *events) OnDeadLetter(d pubsub.DeadLetterEvent) {
	e.add("dead letter %s@%d attempts=%d id=%t evicted=%t err=%v", d.Delivery.Group, d.Delivery.Offset, d.Delivery.Attempt,
		d.Delivery.ID != "", d.Evicted, d.Err)
}

func (e *events) OnRebalance(r pubsub.RebalanceEvent) {
	e.add("rebalance %s/%s %v -> %v", r.Topic, r.Group, r.Before, r.After)
}

func (e *events) OnBackpressure(b pubsub.BackpressureEvent) {
	e.add("backpressure %s/%d waited=%v backpressure=%t", b.Topic, b.Partition, b.Waited, errors.Is(b.Err, pubsub.ErrBackpressure))
}

func (e *events) OnDrop(t pubsub.TrimEvent) {
	e.add("drop %s/%d count=%d", t.Topic, t.Partition, t.Count)
}
func (e *events) OnExpire(t pubsub.TrimEvent) {
	e.add("expire %s/%d count=%d", t.Topic, t.Partition, t.Count)
}

func (e *events) OnSkip(s pubsub.SkipEvent) {
	e.add("skip %s/%s/%d %d..%d", s.Group, s.Topic, s.Partition, s.From, s.To)
}

func (e *events) OnStuck(s pubsub.StuckEvent) {
	e.add("stuck %s/%d@%d consumer=%s attempt=%d running=%v returned=%t", s.Delivery.Group, s.Delivery.Partition,
		s.Delivery.Offset, s.Delivery.Consumer, s.Delivery.Attempt, s.Running, s.Returned)
}

func (e *events) OnClose(c pubsub.CloseEvent) { e.add("close took=%v err=%v", c.Took, c.Err) }

// Publish hooks see each record before it is appended, may add headers
// that reach the consumers, and see where it landed; the context the first
// returns reaches the second.
func TestPublishHooksSeeRecordsAndCarryHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{header: "abc"}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "alice", "paid")
		if _, err := topic.PublishBatch(context.Background(), []pubsub.Entry[string, string]{{Key: "bob", Value: "x"}, {Key: "carol", Value: "y"}}); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		want := []string{
			"publish orders/0 key=alice size=9 batch=0",
			"published orders/0@0 err=false ctx=from OnPublish",
			"publish orders/0 key=bob size=4 batch=2",
			"publish orders/0 key=carol size=6 batch=2",
			"published orders/0@1 err=false ctx=from OnPublish",
			"published orders/0@2 err=false ctx=from OnPublish",
		}
		if got := ev.with("publish"); !slices.Equal(got, want) {
			t.Errorf("publish events (-want +got):\n%s\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
		}
		for _, m := range rec.calls() {
			if m.Headers["trace"] != "abc" {
				t.Errorf("message %d: headers %v, want the trace header the hook set", m.Offset, m.Headers)
			}
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, err := topic.Publish(context.Background(), "dave", "late")
		if got := ev.with("published"); !errors.Is(err, pubsub.ErrClosed) || got[len(got)-1] != "published orders/-1@-1 err=true ctx=from OnPublish" {
			t.Errorf("after Close: Publish %v, last event %q; want ErrClosed, reported with its error", err, got[len(got)-1])
		}
	})
}

// Delivery hooks see each attempt begin and end, with its outcome and how
// long it took; the handler gets the context OnDeliver returned; retries
// and dead letters come from the engine in between.
func TestDeliveryHooksSeeAttemptsOutcomesAndDurations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev), pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}))
		topic := mustTopic(t, b, "orders", codec.String(), pickyStrings())
		var sawCtx []any
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
			sawCtx = append(sawCtx, ctx.Value(ctxKey{}))
			time.Sleep(5 * time.Millisecond)
			switch {
			case m.Value == "flaky" && m.Attempt == 1:
				return errors.New("once")
			case m.Value == "permanent":
				return fmt.Errorf("no: %w", pubsub.ErrPermanent)
			case m.Value == "boom":
				panic("boom")
			}
			return nil
		}))
		for _, v := range []string{"ok", "flaky", "permanent", "boom", "poison"} {
			mustPublish(t, topic, "k", v)
		}
		pubsubtest.Drain(t, b)
		want := []string{
			"deliver billing/orders/0@0 attempt=1 consumer=b1 trace=",
			"delivered billing@0 attempt=1 acked took=5ms",
			"deliver billing/orders/0@1 attempt=1 consumer=b1 trace=",
			"delivered billing@1 attempt=1 failed took=5ms",
			"retry billing@1 attempt=1 delay=1s err=once",
			"deliver billing/orders/0@1 attempt=2 consumer=b1 trace=",
			"delivered billing@1 attempt=2 acked took=5ms",
			"deliver billing/orders/0@2 attempt=1 consumer=b1 trace=",
			"delivered billing@2 attempt=1 failed took=5ms",
			"dead letter billing@2 attempts=1 id=true evicted=false err=no: permanent failure",
			"deliver billing/orders/0@3 attempt=1 consumer=b1 trace=",
			"delivered billing@3 attempt=1 failed took=5ms panic",
			"retry billing@3 attempt=1 delay=1s err=logbus: handler panicked: boom",
			"deliver billing/orders/0@3 attempt=2 consumer=b1 trace=",
			"delivered billing@3 attempt=2 failed took=5ms panic",
			"dead letter billing@3 attempts=2 id=true evicted=false err=logbus: handler panicked: boom",
			"deliver billing/orders/0@4 attempt=1 consumer=b1 trace=",
			"delivered billing@4 attempt=1 undecodable took=0s",
			`dead letter billing@4 attempts=1 id=true evicted=false err=logbus: decode topic "orders" partition 0 offset 4: codec: cannot decode: test: poison bytes`,
		}
		got := slices.DeleteFunc(ev.all(), func(l string) bool { return strings.HasPrefix(l, "rebalance") || strings.HasPrefix(l, "publish") })
		if !slices.Equal(got, want) {
			t.Errorf("events:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
		}
		for i, v := range sawCtx {
			if v != "from OnDeliver" {
				t.Errorf("handler call %d: context value %v, want the one OnDeliver set", i, v)
			}
		}
	})
}

// Joining and leaving a group raise a rebalance with the assignment
// before and after.
func TestRebalanceHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		h := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })
		g := mustSubscribe(t, topic, "billing", "b1", h)
		mustSubscribe(t, topic, "billing", "b2", h)
		if err := g.Leave(context.Background(), "b1"); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"rebalance orders/billing map[] -> map[b1:[0 1]]",
			"rebalance orders/billing map[b1:[0 1]] -> map[b1:[0] b2:[1]]",
			"rebalance orders/billing map[b1:[0] b2:[1]] -> map[b2:[0 1]]",
		}
		if got := ev.with("rebalance"); !slices.Equal(got, want) {
			t.Errorf("rebalances:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
		}
	})
}

// A producer that finds its partition full raises a backpressure wait,
// and a second event with ErrBackpressure when it gives up; DropOldest
// raises drops, a group that lost records to them a skip, MaxAge expiries.
func TestRetentionHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		clock := pubsubtest.NewClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev), pubsub.WithClock(clock))
		h := pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })

		full := mustTopic(t, b, "full", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Second}))
		g := mustSubscribe(t, full, "slow", "s1", h)
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, full, "k", "1")
		if _, err := full.Publish(context.Background(), "k", "2"); !errors.Is(err, pubsub.ErrBackpressure) {
			t.Fatalf("Publish to a full partition: %v, want ErrBackpressure", err)
		}
		if got, want := ev.with("backpressure"), []string{
			"backpressure full/0 waited=0s backpressure=false",
			"backpressure full/0 waited=1s backpressure=true",
		}; !slices.Equal(got, want) {
			t.Errorf("backpressure events %q, want %q", got, want)
		}

		shed := mustTopic(t, b, "shed", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		sg := mustSubscribe(t, shed, "late", "l1", h)
		if err := sg.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			mustPublish(t, shed, "k", fmt.Sprint(i))
		}
		if err := sg.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, want := ev.with("drop"), []string{"drop shed/0 count=1", "drop shed/0 count=1", "drop shed/0 count=1"}; !slices.Equal(got, want) {
			t.Errorf("drop events %q, want %q", got, want)
		}
		if got, want := ev.with("skip"), []string{"skip late/shed/0 0..3"}; !slices.Equal(got, want) {
			t.Errorf("skip events %q, want %q", got, want)
		}

		old := mustTopic(t, b, "old", codec.String(), codec.String(), pubsub.WithRetention(pubsub.Retention{MaxAge: time.Minute}))
		mustPublish(t, old, "k", "1")
		mustPublish(t, old, "k", "2")
		clock.Advance(2 * time.Minute)
		mustPublish(t, old, "k", "3")
		if got, want := ev.with("expire"), []string{"expire old/0 count=2"}; !slices.Equal(got, want) {
			t.Errorf("expire events %q, want %q", got, want)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
	})
}

// Close raises OnClose once, with its result, however many calls there are.
func TestCloseHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			time.Sleep(time.Second)
			return nil
		}))
		mustPublish(t, topic, "k", "v")
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		_ = b.Close(context.Background())
		if got, want := ev.with("close"), []string{"close took=1s err=<nil>"}; !slices.Equal(got, want) {
			t.Errorf("close events %q, want %q", got, want)
		}
	})
}

// panicky is a hook that panics in every hook it implements.
type panicky struct{}

func (panicky) OnPublish(context.Context, *pubsub.PublishInfo) context.Context  { panic("publish") }
func (panicky) OnDeliver(context.Context, *pubsub.DeliveryInfo) context.Context { panic("deliver") }
func (panicky) OnDelivered(context.Context, *pubsub.DeliveryInfo, pubsub.DeliveryResult) {
	panic("delivered")
}
func (panicky) OnRebalance(pubsub.RebalanceEvent) { panic("rebalance") }

// A hook that panics is recovered and logged at Error with its stack; the
// publish and the delivery go on, the handler's outcome is its own, and
// the hooks after it are still called.
func TestPanickingHookIsRecoveredAndLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(panicky{}, ev), pubsub.WithLogger(logs.logger()))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var rec recorder[string]
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublish(t, topic, "k", "v")
		pubsubtest.Drain(t, b)
		if n := len(rec.calls()); n != 1 {
			t.Errorf("handler called %d times, want once", n)
		}
		if s := g.Stats(); s.Delivered != 1 || s.Retried != 0 {
			t.Errorf("stats %+v, want 1 delivered, no retry", s)
		}
		if got := ev.with("delivered"); len(got) != 1 || !strings.Contains(got[0], "acked") {
			t.Errorf("the hook after the panicking one saw %q, want one acked delivery", got)
		}
		panics := logs.find("logbus: hook panicked")
		if len(panics) != 4 {
			t.Fatalf("%d hook panics logged, want 4 (rebalance, publish, deliver, delivered): %v", len(panics), logs.messages())
		}
		for _, r := range panics {
			if r.level != "ERROR" || !strings.Contains(r.attrs["stack"], "panicky") || !strings.Contains(r.attrs["hook"], "panicky") {
				t.Errorf("hook panic record %+v, want Error with the hook and a stack through it", r)
			}
		}
	})
}

// A hook value that implements no Hook interface, or nil, is an error
// wrapping ErrInvalid, reported by Err and NewTopic.
func TestWithHooksRefusesAValueThatHooksNothing(t *testing.T) {
	for name, h := range map[string]pubsub.Hook{"a string": "not a hook", "nil": nil} {
		t.Run(name, func(t *testing.T) {
			b := pubsub.NewBroker(pubsub.WithHooks(&events{}, h))
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			wantErrIs(t, "Err", b.Err(), pubsub.ErrInvalid)
			if !strings.Contains(fmt.Sprint(b.Err()), "hook 1") {
				t.Errorf("Err %v, want it to name hook 1", b.Err())
			}
			_, err := pubsub.NewTopic(b, "t", codec.String(), codec.String())
			wantErrIs(t, "NewTopic", err, pubsub.ErrInvalid)
		})
	}
}

// snapshotter reads the broker's Snapshot from every hook it implements.
type snapshotter struct {
	b     *pubsub.Broker
	mu    sync.Mutex
	reads int
}

func (s *snapshotter) read() {
	_ = s.b.Snapshot()
	s.mu.Lock()
	s.reads++
	s.mu.Unlock()
}

func (s *snapshotter) OnRebalance(pubsub.RebalanceEvent) { s.read() }
func (s *snapshotter) OnPublished(context.Context, *pubsub.PublishInfo, pubsub.Position, error) {
	s.read()
}
func (s *snapshotter) OnDelivered(context.Context, *pubsub.DeliveryInfo, pubsub.DeliveryResult) {
	s.read()
}
func (s *snapshotter) OnDeadLetter(pubsub.DeadLetterEvent) { s.read() }
func (s *snapshotter) OnSkip(pubsub.SkipEvent)             { s.read() }
func (s *snapshotter) OnDrop(pubsub.TrimEvent)             { s.read() }

// Hooks run outside every lock: each may read the broker's Snapshot,
// which takes the broker's, groups' and partitions' locks, without
// deadlocking (Subscribe raises its rebalance after releasing the
// broker's lock).
func TestHooksMayReadTheSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &snapshotter{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(s))
		s.b = b
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, OnFull: pubsub.DropOldest}))
		g := mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			return pubsub.ErrPermanent
		}))
		if err := g.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, topic, "k", "1")
		mustPublish(t, topic, "k", "2") // drops 1
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		// rebalance, 2 published, 1 drop, 1 skip, 1 delivered, 1 dead letter
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.reads != 7 {
			t.Errorf("%d snapshots read from hooks, want 7", s.reads)
		}
	})
}

// A Stream's deliveries raise the same hooks: acked when the consumer
// acks, given back when the Stream closes with a delivery nobody took.
func TestDeliveryHooksOnAStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		s := mustStream(t, topic, "billing", "b1")
		mustPublish(t, topic, "k", "1")
		mustPublish(t, topic, "k", "2")
		d := <-s.C()
		d.Ack()
		synctest.Wait() // the second delivery waits on the channel
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"deliver billing/orders/0@0 attempt=1 consumer=b1 trace=",
			"delivered billing@0 attempt=1 acked took=0s",
			"deliver billing/orders/0@1 attempt=1 consumer=b1 trace=",
			"delivered billing@1 attempt=1 given back took=0s",
		}
		if got := ev.with("deliver"); !slices.Equal(got, want) {
			t.Errorf("events:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
		}
		if _, err := topic.Subscribe("billing", "b2", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil })); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
	})
}

// publishedIDs records the IDs OnPublished is told.
type publishedIDs struct {
	mu  sync.Mutex
	ids []string
}

func (p *publishedIDs) OnPublished(_ context.Context, info *pubsub.PublishInfo, _ pubsub.Position, _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(p.ids, info.ID)
}

// OnPublished is told each record's Message.ID, the one its consumers
// get, whoever names the records.
func TestPublishedHookKnowsTheMessageID(t *testing.T) {
	for name, opts := range map[string][]pubsub.BrokerOption{
		"default IDs": nil,
		"an IDSource": {pubsub.WithIDs(&seqIDs{})},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ids := &publishedIDs{}
				b := pubsubtest.NewBroker(t, append(opts, pubsub.WithHooks(ids))...)
				topic := mustTopic(t, b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
				var rec recorder[string]
				mustSubscribe(t, topic, "g", "c", &rec)
				mustPublish(t, topic, "alice", "1")
				if _, err := topic.PublishValues(context.Background(), []string{"2", "3"}); err != nil {
					t.Fatal(err)
				}
				pubsubtest.Drain(t, b)
				var delivered []string
				for _, m := range rec.calls() {
					delivered = append(delivered, m.ID)
				}
				slices.Sort(delivered)
				got := slices.Sorted(slices.Values(ids.ids))
				if len(got) != 3 || !slices.Equal(got, delivered) || got[0] == "" {
					t.Errorf("IDs published %q, delivered %q: want the same three", got, delivered)
				}
			})
		})
	}
}

// gauge is a hook that keeps the broker to read its Snapshot later, as a
// metrics exporter reads it at collection time.
type gauge struct{ b *pubsub.Broker }

func (g *gauge) OnNewBroker(b *pubsub.Broker) { g.b = b }

func (g *gauge) lag() int64 {
	var lag int64
	for _, t := range g.b.Snapshot().Topics {
		for _, gr := range t.Groups {
			lag += gr.Lag
		}
	}
	return lag
}

// OnNewBroker hands a hook its broker, once, before NewBroker returns.
func TestNewBrokerHookGetsTheBroker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gauge{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(g))
		if g.b != b {
			t.Fatalf("OnNewBroker got %p, want the broker NewBroker returned (%p)", g.b, b)
		}
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		grp := mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err := grp.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, topic, "k", "v")
		if got := g.lag(); got != 1 {
			t.Errorf("lag read through the hook's broker: %d, want 1", got)
		}
		if err := grp.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
	})
}

// A batch consumer's records are deliveries to the hooks, one each: all
// begin before the handler, and end after it as the BatchError says (acked
// before its Index, failed at it, given back after it); the failed record
// is then retried alone.
func TestDeliveryHooksOnABatchConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev), pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Second}))
		topic := mustTopic(t, b, "orders", codec.String(), pickyStrings())
		g, err := topic.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(ctx context.Context, msgs []pubsub.Message[string]) error {
			if ctx.Value(ctxKey{}) != "from OnDeliver" {
				t.Errorf("batch handler: context value %v, want the one OnDeliver set", ctx.Value(ctxKey{}))
			}
			for i, m := range msgs {
				if m.Value == "flaky" && m.Attempt == 1 {
					return &pubsub.BatchError{Index: i, Err: errors.New("once")}
				}
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Pause(context.Background()); err != nil { // so the three arrive as one batch
			t.Fatal(err)
		}
		for _, v := range []string{"ok", "flaky", "after"} {
			mustPublish(t, topic, "k", v)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		want := []string{
			"deliver billing/orders/0@0 attempt=1 consumer=b1 trace=",
			"deliver billing/orders/0@1 attempt=1 consumer=b1 trace=",
			"deliver billing/orders/0@2 attempt=1 consumer=b1 trace=",
			"delivered billing@0 attempt=1 acked took=0s",
			"delivered billing@1 attempt=1 failed took=0s",
			"delivered billing@2 attempt=1 given back took=0s",
			"retry billing@1 attempt=1 delay=1s err=once",
			"deliver billing/orders/0@1 attempt=2 consumer=b1 trace=",
			"delivered billing@1 attempt=2 acked took=0s",
			"deliver billing/orders/0@2 attempt=1 consumer=b1 trace=",
			"delivered billing@2 attempt=1 acked took=0s",
		}
		got := slices.DeleteFunc(ev.all(), func(l string) bool { return strings.HasPrefix(l, "rebalance") || strings.HasPrefix(l, "publish") })
		if !slices.Equal(got, want) {
			t.Errorf("events:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
		}
	})
}

// A batch publish that stops part way, at a partition that stays full,
// reports each record it stored as published and each of the rest with
// the batch's error, which names the call.
func TestPublishedHooksOfABatchThatStopsPartWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, BlockTimeout: time.Second}))
		var rec recorder[string]
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		if err := g.Pause(context.Background()); err != nil { // nothing is committed: the partition fills
			t.Fatal(err)
		}
		_, err := topic.PublishBatch(context.Background(), []pubsub.Entry[string, string]{
			{Key: "a", Value: "1"}, {Key: "b", Value: "2"}, {Key: "c", Value: "3"}})
		if !errors.Is(err, pubsub.ErrBackpressure) || !strings.HasPrefix(err.Error(), `logbus: publish batch to topic "orders"`) {
			t.Fatalf("PublishBatch: %v; want ErrBackpressure, naming the call", err)
		}
		want := []string{
			"published orders/0@0 err=false ctx=from OnPublish",
			"published orders/0@1 err=false ctx=from OnPublish",
			"published orders/-1@-1 err=true ctx=from OnPublish",
		}
		if got := ev.with("published"); !slices.Equal(got, want) {
			t.Errorf("published events (-want +got):\n%s\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// results is a HookDelivered that keeps the first result of each offset
// and attempt (a message given back is delivered again as the same
// attempt).
type results struct {
	mu  sync.Mutex
	got map[string]pubsub.DeliveryResult
}

func (r *results) OnDelivered(_ context.Context, d *pubsub.DeliveryInfo, res pubsub.DeliveryResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := fmt.Sprintf("%d/%d", d.Offset, d.Attempt)
	if _, ok := r.got[key]; !ok {
		r.got[key] = res
	}
}

func (r *results) of(offset int64, attempt int) pubsub.DeliveryResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[fmt.Sprintf("%d/%d", offset, attempt)]
}

// A batch handler's BatchError tells the delivery hooks which message
// failed and with what: at index 0 the first, with the BatchError's own
// Err; at an index past the batch (invalid) the first too, with the
// BatchError, and none of the batch reported acked.
func TestDeliveryHooksReadABatchError(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		index   func(n int) int
		wantErr func(err error) bool
	}{
		{"index 0", func(int) int { return 0 }, func(err error) bool { return err == boom }},
		{"index past the batch", func(n int) int { return n }, func(err error) bool {
			_, ok := errors.AsType[*pubsub.BatchError](err)
			return ok
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				res := &results{got: map[string]pubsub.DeliveryResult{}}
				b := pubsubtest.NewBroker(t, pubsub.WithHooks(res))
				topic := mustTopic(t, b, "orders", codec.String(), codec.String())
				for _, v := range []string{"1", "2"} {
					mustPublish(t, topic, "k", v)
				}
				var calls int
				_, err := topic.SubscribeBatch("billing", "b1", pubsub.BatchHandlerFunc[string](func(_ context.Context, msgs []pubsub.Message[string]) error {
					calls++
					if calls == 1 {
						return &pubsub.BatchError{Index: tc.index(len(msgs)), Err: boom}
					}
					return nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				pubsubtest.Drain(t, b)
				first, second := res.of(0, 1), res.of(1, 1)
				if first.Outcome != pubsub.OutcomeFailed || !tc.wantErr(first.Err) {
					t.Errorf("offset 0, attempt 1: %v with %v; want failed with the right error", first.Outcome, first.Err)
				}
				if second.Outcome != pubsub.OutcomeGivenBack {
					t.Errorf("offset 1, attempt 1: %v; want given back with the first", second.Outcome)
				}
			})
		})
	}
}

// A delivery is stuck from the moment it has run as long as the
// threshold; the snapshot says so, and who owns its partition.
func TestSnapshotCallsADeliveryStuckAtTheThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const after = 2 * time.Second
		stuck := make(chan pubsub.StuckEvent, 1)
		b := pubsubtest.NewBroker(t, pubsub.WithStuckAfter(after), pubsub.WithHooks(stuckHook(stuck)))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		release := make(chan struct{})
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			<-release
			return nil
		}))
		mustPublish(t, topic, "k", "slow")
		e := <-stuck
		p := b.Snapshot().Topics[0].Groups[0].Partitions[0]
		if e.Running != after || p.RunningFor != after || !p.Stuck || p.Owner != "b1" {
			t.Errorf("stuck event after %v; snapshot running %v, stuck %v, owner %q; want %v, stuck, owned by b1",
				e.Running, p.RunningFor, p.Stuck, p.Owner, after)
		}
		close(release)
	})
}

// stuckHook sends each first report of a stuck delivery.
type stuckHook chan pubsub.StuckEvent

func (h stuckHook) OnStuck(e pubsub.StuckEvent) {
	if !e.Returned {
		h <- e
	}
}

// One scenario raises every hook: a hook implementing every Hook
// interface (pubsub.HookCalls, checked against the broker's table of
// them) sees each of its methods called at least once, the two kinds of
// backpressure event and a stuck handler's return included. A new Hook
// interface fails this until HookCalls implements it and the scenario
// raises it.
func TestOneScenarioRaisesEveryHook(t *testing.T) {
	calls := &pubsub.HookCalls{}
	ifaces := pubsub.HookInterfaces()
	for _, iface := range ifaces {
		if !reflect.TypeOf(calls).Implements(iface) {
			t.Fatalf("pubsub.HookCalls does not implement %v", iface)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithHooks(calls), pubsub.WithStuckAfter(time.Second))
		// Publish, deliver and rebalance; a retry, a dead letter, and a
		// handler stuck past WithStuckAfter that then returns.
		orders := mustTopic(t, b, "orders", codec.String(), codec.String())
		failed := false
		mustSubscribe(t, orders, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
			switch m.Value {
			case "flaky":
				if !failed {
					failed = true
					return errBoom
				}
			case "poison":
				return fmt.Errorf("poison: %w", pubsub.ErrPermanent)
			case "slow":
				time.Sleep(3 * time.Second) // virtual time: past the threshold
			}
			return nil
		}))
		for _, v := range []string{"flaky", "poison", "slow"} {
			mustPublish(t, orders, "k", v)
		}
		pubsubtest.Drain(t, b)

		// Backpressure: a producer waits on a full Block partition, then
		// gives up.
		full := mustTopic(t, b, "full", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Second}))
		paused := mustSubscribe(t, full, "slow", "s1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err := paused.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, full, "k", "1")
		if _, err := full.Publish(context.Background(), "k", "2"); !errors.Is(err, pubsub.ErrBackpressure) {
			t.Fatalf("Publish to a full partition: %v, want ErrBackpressure", err)
		}
		if err := paused.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}

		// Drops, and a skip for the group that lost records to them.
		shed := mustTopic(t, b, "shed", codec.String(), codec.String(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, OnFull: pubsub.DropOldest}))
		late := mustSubscribe(t, shed, "late", "l1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
		if err := late.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, shed, "k", "1")
		mustPublish(t, shed, "k", "2")
		if err := late.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}

		// Expiry: records past MaxAge are trimmed by the next publish.
		old := mustTopic(t, b, "old", codec.String(), codec.String(), pubsub.WithRetention(pubsub.Retention{MaxAge: time.Minute}))
		mustPublish(t, old, "k", "1")
		time.Sleep(2 * time.Minute) // virtual time: the record's age
		mustPublish(t, old, "k", "2")

		pubsubtest.Drain(t, b)
		// Membership: raised only by an engine that keeps it on a server
		// (the JetStream engine's tests raise it for real), so as one would.
		pubsub.RaiseMembership(b, "orders", "billing", errBoom)
		pubsub.RaiseMembership(b, "orders", "billing", nil)
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	called := calls.Called()
	for _, iface := range ifaces {
		if name := iface.Method(0).Name; called[name] == 0 {
			t.Errorf("%v: %s never called; called: %v", iface, name, called)
		}
	}
	for _, kind := range []string{"OnBackpressure wait", "OnBackpressure timeout", "OnStuck returned"} {
		if called[kind] == 0 {
			t.Errorf("%s never called; called: %v", kind, called)
		}
	}
}
