package pubsub_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func nopHandler() pubsub.HandlerFunc[string] {
	return func(context.Context, pubsub.Message[string]) error { return nil }
}

// A Subscribe or Stream with bad input fails with the right sentinel, and
// changes nothing: no group is created, no consumer is added.
func TestSubscribeRejectsBadInput(t *testing.T) {
	type topic = *pubsub.Topic[string, string]
	subscribe := func(group, consumer string, h pubsub.Handler[string], opts ...pubsub.SubscribeOption) func(topic) (bool, error) {
		return func(tp topic) (bool, error) {
			g, err := tp.Subscribe(group, consumer, h, opts...)
			return g != nil, err
		}
	}
	stream := func(group, consumer string, opts ...pubsub.SubscribeOption) func(topic) (bool, error) {
		return func(tp topic) (bool, error) {
			s, err := tp.Stream(group, consumer, opts...)
			return s != nil, err
		}
	}
	tests := []struct {
		name  string
		group string // the group the call names
		join  func(topic) (gotHandle bool, err error)
		want  error
	}{
		{"nil Handler interface", "g", subscribe("g", "c", nil), pubsub.ErrSubscription},
		{"nil HandlerFunc", "g", subscribe("g", "c", pubsub.HandlerFunc[string](nil)), pubsub.ErrSubscription},
		{"empty group name", "", subscribe("", "c", nopHandler()), pubsub.ErrSubscription},
		{"empty consumer name", "g", subscribe("g", "", nopHandler()), pubsub.ErrSubscription},
		{"negative group MaxAttempts", "g", subscribe("g", "c", nopHandler(), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: -1})), pubsub.ErrInvalid},
		{"negative group BaseDelay", "g", subscribe("g", "c", nopHandler(), pubsub.WithGroupRetry(pubsub.RetryPolicy{BaseDelay: -time.Millisecond})), pubsub.ErrInvalid},
		{"negative group MaxDelay", "g", subscribe("g", "c", nopHandler(), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxDelay: -time.Second})), pubsub.ErrInvalid},
		{"group Multiplier below 1", "g", subscribe("g", "c", nopHandler(), pubsub.WithGroupRetry(pubsub.RetryPolicy{Multiplier: 0.5})), pubsub.ErrInvalid},
		{"negative dead-letter limit", "g", subscribe("g", "c", nopHandler(), pubsub.WithDeadLetterLimit(-1)), pubsub.ErrInvalid},
		{"stream: empty group name", "", stream("", "c"), pubsub.ErrSubscription},
		{"stream: empty consumer name", "g", stream("g", ""), pubsub.ErrSubscription},
		{"stream: negative group MaxAttempts", "g", stream("g", "c", pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: -1})), pubsub.ErrInvalid},
		{"stream: negative dead-letter limit", "g", stream("g", "c", pubsub.WithDeadLetterLimit(-1)), pubsub.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, tp := newTopic(t, "orders")
				mustPublishValue(t, tp, "x")
				gotHandle, err := tt.join(tp)
				if !errors.Is(err, tt.want) {
					t.Fatalf("got error %v, want one wrapping %v", err, tt.want)
				}
				if gotHandle {
					t.Errorf("got a non-nil handle alongside the error, want nil")
				}
				// Nothing changed: the group does not exist...
				if _, err := b.Lag(tt.group, "orders"); !errors.Is(err, pubsub.ErrSubscription) {
					t.Errorf("Lag(%q) after the failed call: got error %v, want ErrSubscription (no group)", tt.group, err)
				}
				// ...and a valid call creates it afresh, with one consumer, at
				// the oldest record.
				var rec recorder[string]
				g := mustSubscribe(t, tp, "g", "c", &rec)
				if asg := g.Assignment(); len(asg) != 1 || !slices.Equal(asg["c"], []int{0}) {
					t.Errorf("assignment: got %v, want only c, owning partition 0", asg)
				}
				pubsubtest.Drain(t, b)
				if got := rec.values(); !slices.Equal(got, []string{"x"}) {
					t.Errorf("the valid consumer got %q, want [x]", got)
				}
			})
		})
	}
}

// A consumer name already in the group is ErrSubscription, whether the
// member and the newcomer are handlers or streams; the member keeps its
// partitions and goes on working.
func TestSubscribeDuplicateConsumer(t *testing.T) {
	tests := []struct {
		name                   string
		firstStream, dupStream bool
	}{
		{"handler then handler", false, false},
		{"handler then stream", false, true},
		{"stream then handler", true, false},
		{"stream then stream", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, tp := newTopic(t, "orders")
				var rec recorder[string]
				var first *pubsub.Stream[string]
				var g *pubsub.Group[string]
				if tt.firstStream {
					first = mustStream(t, tp, "billing", "b1")
					g = first.Group()
				} else {
					g = mustSubscribe(t, tp, "billing", "b1", &rec)
				}
				var err error
				if tt.dupStream {
					var s *pubsub.Stream[string]
					s, err = tp.Stream("billing", "b1")
					if s != nil {
						t.Errorf("duplicate Stream: got a non-nil *Stream, want nil")
					}
				} else {
					var dup recorder[string]
					var g2 *pubsub.Group[string]
					g2, err = tp.Subscribe("billing", "b1", &dup)
					if g2 != nil {
						t.Errorf("duplicate Subscribe: got a non-nil *Group, want nil")
					}
				}
				if !errors.Is(err, pubsub.ErrSubscription) {
					t.Fatalf("duplicate consumer: got error %v, want one wrapping ErrSubscription", err)
				}
				if asg := g.Assignment(); len(asg) != 1 || !slices.Equal(asg["b1"], []int{0}) {
					t.Errorf("assignment after the failed join: got %v, want only b1, owning partition 0", asg)
				}
				mustPublishValue(t, tp, "x")
				if tt.firstStream {
					d := recv(t, first)
					if d.Value != "x" {
						t.Errorf("the first consumer got %q, want \"x\"", d.Value)
					}
					d.Ack()
				}
				pubsubtest.Drain(t, b)
				if !tt.firstStream {
					if got := rec.values(); !slices.Equal(got, []string{"x"}) {
						t.Errorf("the first consumer got %q, want [x]", got)
					}
				}
				if got := g.Stats().Delivered; got != 1 {
					t.Errorf("Delivered: got %d, want 1", got)
				}
			})
		})
	}
}

// NewTopic with bad input fails with the right sentinel and does not take
// the name.
func TestNewTopicRejectsBadInput(t *testing.T) {
	type newTopicFunc func(b *pubsub.Broker) (*pubsub.Topic[string, string], error)
	withOpts := func(opts ...pubsub.TopicOption) newTopicFunc {
		return func(b *pubsub.Broker) (*pubsub.Topic[string, string], error) {
			return pubsub.NewTopic(b, "orders", codec.String(), codec.String(), opts...)
		}
	}
	tests := []struct {
		name       string
		brokerOpts []pubsub.BrokerOption
		create     newTopicFunc
		want       error
	}{
		{"zero partitions", nil, withOpts(pubsub.WithPartitions(0)), pubsub.ErrInvalid},
		{"negative partitions", nil, withOpts(pubsub.WithPartitions(-1)), pubsub.ErrInvalid},
		{"negative MaxMessages", nil, withOpts(pubsub.WithRetention(pubsub.Retention{MaxMessages: -1})), pubsub.ErrInvalid},
		{"negative BlockTimeout", nil, withOpts(pubsub.WithRetention(pubsub.Retention{BlockTimeout: -time.Second})), pubsub.ErrInvalid},
		{"negative MaxAge", nil, withOpts(pubsub.WithRetention(pubsub.Retention{MaxAge: -time.Second})), pubsub.ErrInvalid},
		{"unknown FullPolicy", nil, withOpts(pubsub.WithRetention(pubsub.Retention{OnFull: pubsub.FullPolicy(7)})), pubsub.ErrInvalid},
		{"empty name", nil, func(b *pubsub.Broker) (*pubsub.Topic[string, string], error) {
			return pubsub.NewTopic(b, "", codec.String(), codec.String())
		}, pubsub.ErrInvalid},
		{"nil key codec", nil, func(b *pubsub.Broker) (*pubsub.Topic[string, string], error) {
			return pubsub.NewTopic[string, string](b, "orders", nil, codec.String())
		}, pubsub.ErrInvalid},
		{"nil value codec", nil, func(b *pubsub.Broker) (*pubsub.Topic[string, string], error) {
			return pubsub.NewTopic[string, string](b, "orders", codec.String(), nil)
		}, pubsub.ErrInvalid},
		{"nil broker", nil, func(*pubsub.Broker) (*pubsub.Topic[string, string], error) {
			return pubsub.NewTopic(nil, "orders", codec.String(), codec.String())
		}, pubsub.ErrInvalid},
		{"broker with negative MaxAttempts", []pubsub.BrokerOption{pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: -1})}, withOpts(), pubsub.ErrInvalid},
		{"broker with negative BaseDelay", []pubsub.BrokerOption{pubsub.WithRetry(pubsub.RetryPolicy{BaseDelay: -1})}, withOpts(), pubsub.ErrInvalid},
		{"broker with Multiplier below 1", []pubsub.BrokerOption{pubsub.WithRetry(pubsub.RetryPolicy{Multiplier: 0.9})}, withOpts(), pubsub.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := pubsubtest.NewBroker(t, tt.brokerOpts...)
				if tt.brokerOpts != nil {
					wantErrIs(t, "Broker.Err()", b.Err(), pubsub.ErrInvalid)
				} else if err := b.Err(); err != nil {
					t.Errorf("Broker.Err(): got %v, want nil", err)
				}
				tp, err := tt.create(b)
				if !errors.Is(err, tt.want) {
					t.Fatalf("got error %v, want one wrapping %v", err, tt.want)
				}
				if tp != nil {
					t.Errorf("got a non-nil *Topic alongside the error, want nil")
				}
				_, err = pubsub.NewTopic(b, "orders", codec.String(), codec.String())
				if tt.brokerOpts != nil {
					// The broker's bad option is reported by every NewTopic.
					if !errors.Is(err, pubsub.ErrInvalid) {
						t.Errorf("a second NewTopic on the misconfigured broker: got %v, want ErrInvalid", err)
					}
					return
				}
				if err != nil {
					t.Errorf("NewTopic(\"orders\") after the failed call: got %v, want nil (the name is still free)", err)
				}
			})
		})
	}
}

// A name already taken is ErrTopicExists, whatever the types; the topic
// that has it is unaffected.
func TestNewTopicTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, tp := newTopic(t, "orders", pubsub.WithPartitions(2))
		if other, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String()); !errors.Is(err, pubsub.ErrTopicExists) || other != nil {
			t.Errorf("same types: got (%v, %v), want (nil, ErrTopicExists)", other, err)
		}
		if other, err := pubsub.NewTopic(b, "orders", codec.Int[int](), codec.Bytes()); !errors.Is(err, pubsub.ErrTopicExists) || other != nil {
			t.Errorf("other types: got (%v, %v), want (nil, ErrTopicExists)", other, err)
		}
		if n := tp.Partitions(); n != 2 {
			t.Errorf("Partitions of the original topic: got %d, want 2", n)
		}
		if pos := mustPublish(t, tp, "k", "v"); pos.Offset != 0 {
			t.Errorf("publish to the original topic: got offset %d, want 0", pos.Offset)
		}
	})
}

// Lookups by name fail with ErrTopicNotFound or ErrSubscription, and
// impossible offsets with ErrInvalid; none of them moves the group.
func TestUnknownNamesAndBadReplay(t *testing.T) {
	tests := []struct {
		name string
		call func(b *pubsub.Broker, g *pubsub.Group[string]) error
		want error
	}{
		{"Lag of unknown topic", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			_, err := b.Lag("billing", "nope")
			return err
		}, pubsub.ErrTopicNotFound},
		{"Lag of unknown group", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			_, err := b.Lag("nope", "orders")
			return err
		}, pubsub.ErrSubscription},
		{"Lag with group and topic swapped", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			_, err := b.Lag("orders", "billing")
			return err
		}, pubsub.ErrTopicNotFound},
		{"Replay of unknown topic", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			return b.Replay(context.Background(), "billing", "nope", pubsub.AtOffset(0))
		}, pubsub.ErrTopicNotFound},
		{"Replay of unknown group", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			return b.Replay(context.Background(), "nope", "orders", pubsub.AtOffset(0))
		}, pubsub.ErrSubscription},
		{"Broker.Replay(context.Background(), pubsub.AtOffset(-1))", func(b *pubsub.Broker, _ *pubsub.Group[string]) error {
			return b.Replay(context.Background(), "billing", "orders", pubsub.AtOffset(-1))
		}, pubsub.ErrInvalid},
		{"Group.Replay(context.Background(), pubsub.AtOffset(-1))", func(_ *pubsub.Broker, g *pubsub.Group[string]) error {
			return g.Replay(context.Background(), pubsub.AtOffset(-1))
		}, pubsub.ErrInvalid},
		{"Leave of unknown consumer", func(_ *pubsub.Broker, g *pubsub.Group[string]) error {
			return g.Leave(context.Background(), "nope")
		}, pubsub.ErrSubscription},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, tp := newTopic(t, "orders")
				var rec recorder[string]
				g := mustSubscribe(t, tp, "billing", "b1", &rec)
				mustPublishValue(t, tp, "a")
				mustPublishValue(t, tp, "b")
				pubsubtest.Drain(t, b)
				if err := tt.call(b, g); !errors.Is(err, tt.want) {
					t.Fatalf("got error %v, want one wrapping %v", err, tt.want)
				}
				synctest.Wait()
				if c := g.Committed(0); c != 2 {
					t.Errorf("Committed(0) after the failed call: got %d, want 2", c)
				}
				if got := rec.values(); !slices.Equal(got, []string{"a", "b"}) {
					t.Errorf("deliveries after the failed call: got %q, want [a b] (nothing redelivered)", got)
				}
				if asg := g.Assignment(); !slices.Equal(asg["b1"], []int{0}) {
					t.Errorf("assignment: got %v, want b1 still owning partition 0", asg)
				}
			})
		})
	}
}

// Seek accepts offsets in [earliest retained, end] on a partition that
// exists; anything else fails and leaves the offset where it was.
func TestSeekOutOfRange(t *testing.T) {
	tests := []struct {
		name      string
		partition int
		offset    int64
		want      error
	}{
		{"below the earliest retained", 0, 1, pubsub.ErrOffsetOutOfRange},
		{"negative offset", 0, -1, pubsub.ErrOffsetOutOfRange},
		{"past the end", 0, 5, pubsub.ErrOffsetOutOfRange},
		{"far past the end", 0, 1 << 40, pubsub.ErrOffsetOutOfRange},
		{"partition that does not exist", 1, 2, pubsub.ErrInvalid},
		{"negative partition", -1, 2, pubsub.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, tp := newTopic(t, "orders",
					pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
				for _, v := range []string{"e0", "e1", "e2", "e3"} {
					mustPublishValue(t, tp, v)
				}
				// Retained: offsets 2 and 3; the end is 4.
				var rec recorder[string]
				g := mustSubscribe(t, tp, "billing", "b1", &rec)
				pubsubtest.Drain(t, b)
				if got := rec.values(); !slices.Equal(got, []string{"e2", "e3"}) {
					t.Fatalf("delivered %q, want [e2 e3]", got)
				}
				if earliest, end, err := tp.Offsets(0); earliest != 2 || end != 4 || err != nil {
					t.Errorf("Offsets(0): got (%d, %d, %v), want (2, 4, nil)", earliest, end, err)
				}
				if _, _, err := tp.Offsets(tt.partition); tt.want == pubsub.ErrInvalid && !errors.Is(err, pubsub.ErrInvalid) {
					t.Errorf("Offsets(%d): got error %v, want ErrInvalid", tt.partition, err)
				}
				if err := g.Seek(context.Background(), tt.partition, tt.offset); !errors.Is(err, tt.want) {
					t.Fatalf("Seek(%d, %d): got error %v, want one wrapping %v", tt.partition, tt.offset, err, tt.want)
				}
				synctest.Wait()
				if c := g.Committed(0); c != 4 {
					t.Errorf("Committed(0) after the failed Seek: got %d, want 4", c)
				}
				if n := len(rec.calls()); n != 2 {
					t.Errorf("deliveries after the failed Seek: got %d, want 2 (nothing redelivered)", n)
				}
				// The bounds themselves are accepted.
				for _, off := range []int64{4, 2} {
					if err := g.Seek(context.Background(), 0, off); err != nil {
						t.Errorf("Seek(0, %d): got %v, want nil", off, err)
					}
				}
				pubsubtest.Drain(t, b)
				if got := rec.values(); !slices.Equal(got, []string{"e2", "e3", "e2", "e3"}) {
					t.Errorf("after Seek(0, 2): delivered %q, want [e2 e3 e2 e3]", got)
				}
			})
		})
	}
}

// Once Close has begun, every call that would add work fails with ErrClosed
// and appends nothing.
func TestClosedBrokerRefusesNewWork(t *testing.T) {
	type fixture struct {
		b  *pubsub.Broker
		tp *pubsub.Topic[string, string]
		g  *pubsub.Group[string]
	}
	tests := []struct {
		name string
		call func(f fixture) error
	}{
		{"Publish", func(f fixture) error {
			_, err := f.tp.Publish(context.Background(), "k", "v")
			return err
		}},
		{"PublishValue", func(f fixture) error {
			_, err := f.tp.PublishValue(context.Background(), "v")
			return err
		}},
		{"Subscribe to an existing group", func(f fixture) error {
			_, err := f.tp.Subscribe("billing", "b2", nopHandler())
			return err
		}},
		{"Subscribe to a new group", func(f fixture) error {
			_, err := f.tp.Subscribe("audit", "a1", nopHandler())
			return err
		}},
		{"Stream", func(f fixture) error {
			_, err := f.tp.Stream("audit", "a1")
			return err
		}},
		{"NewTopic", func(f fixture) error {
			_, err := pubsub.NewTopic(f.b, "more", codec.String(), codec.String())
			return err
		}},
		{"Seek", func(f fixture) error { return f.g.Seek(context.Background(), 0, 0) }},
		{"Group.Replay", func(f fixture) error { return f.g.Replay(context.Background(), pubsub.AtOffset(0)) }},
		{"Broker.Replay", func(f fixture) error {
			return f.b.Replay(context.Background(), "billing", "orders", pubsub.AtOffset(0))
		}},
		{"Leave", func(f fixture) error { return f.g.Leave(context.Background(), "b1") }},
		// ErrClosed comes before what the arguments would earn on a
		// running broker.
		{"Seek past the end", func(f fixture) error { return f.g.Seek(context.Background(), 0, 99) }},
		{"Seek to a partition that does not exist", func(f fixture) error { return f.g.Seek(context.Background(), 7, 0) }},
		{"Group.Replay from a negative offset", func(f fixture) error {
			return f.g.Replay(context.Background(), pubsub.AtOffset(-1))
		}},
		{"Broker.Replay of an unknown group", func(f fixture) error {
			return f.b.Replay(context.Background(), "nobody", "orders", pubsub.Earliest())
		}},
		{"Broker.Replay on an unknown topic", func(f fixture) error {
			return f.b.Replay(context.Background(), "billing", "nowhere", pubsub.Earliest())
		}},
		{"Leave of an unknown consumer", func(f fixture) error { return f.g.Leave(context.Background(), "nobody") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, tp := newTopic(t, "orders")
				var rec recorder[string]
				g := mustSubscribe(t, tp, "billing", "b1", &rec)
				mustPublishValue(t, tp, "before")
				if err := b.Close(context.Background()); err != nil {
					t.Fatalf("Close: got %v, want nil", err)
				}
				err := tt.call(fixture{b, tp, g})
				if !errors.Is(err, pubsub.ErrClosed) {
					t.Fatalf("got error %v, want one wrapping ErrClosed", err)
				}
				if st := tp.Stats(); st.Published != 1 {
					t.Errorf("Published: got %d, want 1", st.Published)
				}
				if got := rec.values(); !slices.Equal(got, []string{"before"}) {
					t.Errorf("deliveries: got %q, want [before]", got)
				}
			})
		})
	}
}

// A Block partition that a group keeps full fails Publish with
// ErrBackpressure after exactly BlockTimeout, having appended nothing.
func TestPublishBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, tp := newTopic(t, "jobs",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, OnFull: pubsub.Block, BlockTimeout: 50 * time.Millisecond}))
		release := make(chan struct{})
		rec := recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
			<-release // the group commits nothing until the test lets go
			return nil
		}}
		mustSubscribe(t, tp, "workers", "w1", &rec)
		mustPublishValue(t, tp, "j1")
		start := time.Now()
		_, err := tp.PublishValue(context.Background(), "j2")
		wantErrIs(t, "PublishValue to a full partition", err, pubsub.ErrBackpressure)
		if waited := time.Since(start); waited != 50*time.Millisecond {
			t.Errorf("Publish waited %v, want the 50ms BlockTimeout", waited)
		}
		want := pubsub.TopicStats{Published: 1, Retained: 1, RetainedBytes: 2, Blocked: 1, TimedOut: 1} // "j1"
		if got := tp.Stats(); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
		// The group commits j1, which makes room: the next record takes offset 1.
		close(release)
		pubsubtest.Drain(t, b)
		if pos := mustPublishValue(t, tp, "j3"); pos.Offset != 1 {
			t.Errorf("publish after the room appeared: got offset %d, want 1", pos.Offset)
		}
		pubsubtest.Drain(t, b)
		if got := rec.values(); !slices.Equal(got, []string{"j1", "j3"}) {
			t.Errorf("delivered %q, want [j1 j3]", got)
		}
		// j1 was freed once the group had committed past it.
		want = pubsub.TopicStats{Published: 2, Retained: 1, RetainedBytes: 2, Reclaimed: 1, Blocked: 1, TimedOut: 1} // "j3"
		if got := tp.Stats(); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// A blocked Publish never waits past its own context: it fails with the
// context's error, not ErrBackpressure, and appends nothing.
func TestBlockedPublishHonoursItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, tp := newTopic(t, "jobs",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Hour}))
		release := make(chan struct{})
		defer close(release)
		mustSubscribe(t, tp, "workers", "w1", stuckHandler(release)) // holds j1
		mustPublishValue(t, tp, "j1")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := tp.PublishValue(ctx, "j2")
		wantErrIs(t, "PublishValue with a 10ms context", err, context.DeadlineExceeded)
		if errors.Is(err, pubsub.ErrBackpressure) {
			t.Errorf("PublishValue: got %v, want the context's error, not ErrBackpressure", err)
		}
		if waited := time.Since(start); waited != 10*time.Millisecond {
			t.Errorf("Publish waited %v, want 10ms (its context's deadline)", waited)
		}
		if st := tp.Stats(); st.Published != 1 || st.Blocked != 1 || st.TimedOut != 0 {
			t.Errorf("stats: got %+v, want Published 1, Blocked 1, TimedOut 0", st)
		}
	})
}

// A producer blocked on a full partition fails with ErrClosed when Close
// begins, before Close waits for the groups to drain.
func TestBlockedPublishFailsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, tp := newTopic(t, "jobs",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, BlockTimeout: time.Hour}))
		release := make(chan struct{})
		mustSubscribe(t, tp, "workers", "w1", stuckHandler(release)) // holds j1
		mustPublishValue(t, tp, "j1")
		blocked := make(chan error, 1)
		go func() {
			_, err := tp.PublishValue(context.Background(), "j2")
			blocked <- err
		}()
		synctest.Wait()
		select {
		case err := <-blocked:
			t.Fatalf("Publish to a full partition returned %v at once, want it to block", err)
		default:
		}
		start := time.Now()
		closed := make(chan error)
		go func() { closed <- b.Close(context.Background()) }()
		wantErrIs(t, "the blocked Publish", <-blocked, pubsub.ErrClosed) // while Close waits for w1
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the blocked Publish returned after %v, want at once", waited)
		}
		close(release)
		if err := <-closed; err != nil {
			t.Fatalf("Close: got %v, want nil", err)
		}
		if got := tp.Stats().Published; got != 1 {
			t.Errorf("Published: got %d, want 1", got)
		}
	})
}

// A failed publish appends nothing and the next record takes the next
// offset, whatever made it fail.
func TestFailedPublishAppendsNothing(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		key     string
		value   string
		keyless bool
		want    []error
	}{
		{"value codec fails", context.Background(), "k", "unencodable", false, []error{codec.ErrEncode, errUnencodable}},
		{"value codec fails, keyless", context.Background(), "", "unencodable", true, []error{codec.ErrEncode, errUnencodable}},
		{"key codec fails", context.Background(), "unencodable", "v", false, []error{codec.ErrEncode, errUnencodable}},
		{"partitioner returns the partition count", context.Background(), "too-far", "v", false, []error{pubsub.ErrInvalid}},
		{"partitioner returns a negative partition", context.Background(), "negative", "v", false, []error{pubsub.ErrInvalid}},
		{"cancelled context", cancelled, "k", "v", false, []error{context.Canceled}},
	}
	// Routes every key to partition 0 but two, which it routes out of range.
	partitioner := partitionerFunc(func(key []byte, n int) int {
		switch string(key) {
		case "too-far":
			return n
		case "negative":
			return -1
		}
		return 0
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := pubsubtest.NewBroker(t)
				tp := mustTopic(t, b, "orders", pickyStrings(), pickyStrings(),
					pubsub.WithPartitions(2), pubsub.WithPartitioner(partitioner))
				if pos := mustPublish(t, tp, "k", "first"); pos != (pubsub.Position{Partition: 0, Offset: 0}) {
					t.Fatalf("first publish: got %+v, want partition 0 offset 0", pos)
				}
				var (
					pos pubsub.Position
					err error
				)
				if tt.keyless {
					pos, err = tp.PublishValue(tt.ctx, tt.value)
				} else {
					pos, err = tp.Publish(tt.ctx, tt.key, tt.value)
				}
				wantErrIs(t, "the failing publish", err, tt.want...)
				if err == nil {
					t.FailNow()
				}
				if want := (pubsub.Position{Partition: -1, Offset: -1}); pos != want {
					t.Errorf("position of the failed publish: got %+v, want %+v", pos, want)
				}
				if st := tp.Stats(); st.Published != 1 || st.Retained != 1 {
					t.Errorf("stats after the failed publish: got Published %d Retained %d, want 1 and 1", st.Published, st.Retained)
				}
				if pos := mustPublish(t, tp, "k", "second"); pos != (pubsub.Position{Partition: 0, Offset: 1}) {
					t.Errorf("next publish: got %+v, want partition 0 offset 1", pos)
				}
				var rec recorder[string]
				mustSubscribe(t, tp, "billing", "b1", &rec)
				pubsubtest.Drain(t, b)
				if got := rec.values(); !slices.Equal(got, []string{"first", "second"}) {
					t.Errorf("delivered %q, want [first second]", got)
				}
			})
		})
	}
}

// A partitioner that picks a partition the topic does not have is named
// in the error, with what it picked.
func TestAPartitionOutOfRangeNamesThePartitioner(t *testing.T) {
	_, tp := newTopic(t, "orders", pubsub.WithPartitions(2),
		pubsub.WithPartitioner(partitionerFunc(func([]byte, int) int { return 2 })))
	_, err := tp.Publish(context.Background(), "k", "v")
	if !errors.Is(err, pubsub.ErrInvalid) || !strings.Contains(err.Error(), "partitioner chose partition 2 of 2") {
		t.Fatalf("Publish: %v; want ErrInvalid naming the partitioner's choice", err)
	}
}

// ShutdownError says what Close left, and why when it knows.
func TestShutdownErrorText(t *testing.T) {
	left := []pubsub.Unfinished{
		{Group: "billing", Topic: "orders", Partition: 0, Committed: 3, End: 5},
		{Group: "billing", Topic: "orders", Partition: 1, Committed: 0, End: 1, Running: true},
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, `logbus: close left records undelivered: group "billing" topic "orders" partition 0 committed 3 end 5, ` +
			`group "billing" topic "orders" partition 1 committed 0 end 1 (handler still running)`},
		{context.DeadlineExceeded, `logbus: close left records undelivered (context deadline exceeded): group "billing" topic "orders" partition 0 committed 3 end 5, ` +
			`group "billing" topic "orders" partition 1 committed 0 end 1 (handler still running)`},
	} {
		if got := (&pubsub.ShutdownError{Unfinished: left, Err: tc.err}).Error(); got != tc.want {
			t.Errorf("Error():\n got %s\nwant %s", got, tc.want)
		}
	}
}
