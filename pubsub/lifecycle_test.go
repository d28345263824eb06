package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// plain is the in-memory engine with none of the optional abilities of
// the lifecycle: it cannot delete, its groups can neither discard nor page
// their dead letters, and it neither pings nor describes itself. With
// deletes set it can delete, and nothing more.
type plain struct{ deletes bool }

func (p plain) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	if err != nil || !p.deletes {
		return plainEngine{e}, err
	}
	return deletingEngine{plainEngine{e}}, nil
}

// plainEngine hides every optional interface of the engine it wraps, and
// of its groups.
type plainEngine struct{ engine.Engine }

func (e plainEngine) Subscribe(ctx context.Context, topic, group, consumer string, h engine.Handler, onLeave func(), spec engine.GroupSpec) (engine.Group, error) {
	g, err := e.Engine.Subscribe(ctx, topic, group, consumer, h, onLeave, spec)
	if err != nil {
		return nil, err
	}
	return plainGroup{g}, nil
}

func (e plainEngine) Group(ctx context.Context, topic, group string) (engine.Group, error) {
	g, err := e.Engine.Group(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	return plainGroup{g}, nil
}

type plainGroup struct{ engine.Group }

// deletingEngine is a plainEngine that can delete.
type deletingEngine struct{ plainEngine }

func (e deletingEngine) DeleteGroup(ctx context.Context, topic, group string) error {
	return e.Engine.(engine.Deleter).DeleteGroup(ctx, topic, group)
}

func (e deletingEngine) DeleteTopic(ctx context.Context, topic string) error {
	return e.Engine.(engine.Deleter).DeleteTopic(ctx, topic)
}

// countingStrings is codec.String counting its decodes.
func countingStrings(decodes *atomic.Int64) codec.Codec[string] {
	return codec.Func(func(s string) ([]byte, error) { return []byte(s), nil },
		func(b []byte) (string, error) { decodes.Add(1); return string(b), nil })
}

// deadLettered returns a group of topic that dead-letters every record, and
// the values 0..n-1 published to it and dead-lettered.
func deadLettered(t *testing.T, b *pubsub.Broker, topic *pubsub.Topic[string, string], n int) *pubsub.Group[string] {
	t.Helper()
	g := mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
		return pubsub.ErrPermanent
	}))
	for i := range n {
		mustPublishValue(t, topic, fmt.Sprint(i))
	}
	pubsubtest.Drain(t, b)
	return g
}

func letterValues(letters []pubsub.DeadLetter[string]) []string {
	out := make([]string, len(letters))
	for i, l := range letters {
		out[i] = l.Message.Value
	}
	return out
}

// LatestDeadLetters decodes only the letters it returns, whether the
// engine pages its dead letters or the typed layer takes them from
// DeadLetters.
func TestLatestDeadLettersDecodesOnlyTheNewest(t *testing.T) {
	for name, eng := range map[string]pubsub.Engine{"in-memory": pubsub.InMemory(), "an engine that cannot page": plain{}} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := pubsubtest.NewBroker(t, pubsub.WithEngine(eng))
				var decodes atomic.Int64
				topic := mustTopic(t, b, "orders", codec.String(), countingStrings(&decodes))
				g := deadLettered(t, b, topic, 10)
				decodes.Store(0)
				letters, err := g.LatestDeadLetters(context.Background(), 3)
				if got := letterValues(letters); err != nil || !slices.Equal(got, []string{"9", "8", "7"}) {
					t.Errorf("LatestDeadLetters(3): got %q, %v; want [9 8 7], nil", got, err)
				}
				if n := decodes.Load(); n != 3 {
					t.Errorf("LatestDeadLetters(3) decoded %d values, want 3", n)
				}
			})
		})
	}
}

// Without the ability, DeleteGroup, DeleteTopic and DiscardDeadLetters say
// the engine cannot, and change nothing; Ping is nil.
func TestLifecycleOnAnEngineWithoutTheAbilities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(plain{}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		g := deadLettered(t, b, topic, 2)
		for name, tc := range map[string]struct {
			err  error
			text string
		}{
			"DeleteGroup": {b.DeleteGroup(context.Background(), "billing", "orders"), "the engine cannot delete groups"},
			"DeleteTopic": {b.DeleteTopic(context.Background(), "orders"), "the engine cannot delete topics"},
			"DiscardDeadLetters": {func() error {
				_, err := g.DiscardDeadLetters(context.Background(), nil)
				return err
			}(), "the engine cannot discard dead letters"},
		} {
			if !errors.Is(tc.err, pubsub.ErrInvalid) || !strings.Contains(fmt.Sprint(tc.err), tc.text) {
				t.Errorf("%s: got %v, want ErrInvalid saying %q", name, tc.err, tc.text)
			}
		}
		if err := b.Ping(context.Background()); err != nil {
			t.Errorf("Ping on an engine that is no Pinger: got %v, want nil", err)
		}
		if n := len(g.DeadLetters()); n != 2 {
			t.Errorf("%d dead letters, want both still there", n)
		}
		mustPublishValue(t, topic, "2")
		pubsubtest.Drain(t, b)
		if n := len(g.DeadLetters()); n != 3 {
			t.Errorf("the group after the refused DeleteGroup: %d dead letters, want 3 (it still consumes)", n)
		}
	})
}

// The typed layer's registry forgets deleted groups and topics: a Partial
// snapshot (an engine that cannot describe itself) lists them no more, and
// a topic created again under the name is listed afresh.
func TestPartialSnapshotForgetsDeletedGroupsAndTopics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(plain{deletes: true}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		mustSubscribe(t, topic, "audit", "a1", &rec)
		mustPublishValue(t, topic, "a")
		pubsubtest.Drain(t, b)
		groups := func() []string {
			s := b.Snapshot()
			if !s.Partial {
				t.Fatal("the snapshot is not Partial: the test engine describes itself")
			}
			var out []string
			for _, ts := range s.Topics {
				for _, gs := range ts.Groups {
					out = append(out, fmt.Sprintf("%s/%s@%d", ts.Name, gs.Name, ts.Stats.Published))
				}
			}
			return out
		}
		if err := b.DeleteGroup(context.Background(), "billing", "orders"); err != nil {
			t.Fatal(err)
		}
		if got := groups(); !slices.Equal(got, []string{"orders/audit@1"}) {
			t.Errorf("after DeleteGroup: %q, want [orders/audit@1]", got)
		}
		if err := b.DeleteTopic(context.Background(), "orders"); err != nil {
			t.Fatal(err)
		}
		if got := b.Snapshot().Topics; len(got) != 0 {
			t.Errorf("after DeleteTopic: %d topics, want none", len(got))
		}
		again := mustTopic(t, b, "orders", codec.String(), codec.String())
		mustSubscribe(t, again, "billing", "b1", &rec)
		if got := groups(); !slices.Equal(got, []string{"orders/billing@0"}) {
			t.Errorf("the topic created again: %q, want [orders/billing@0]", got)
		}
	})
}

// pinging is the in-memory engine answering Ping with err, counting the
// calls.
type pinging struct {
	err   error
	calls *atomic.Int64
}

func (p pinging) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	return pingingEngine{e, p}, err
}

type pingingEngine struct {
	engine.Engine
	p pinging
}

func (e pingingEngine) Ping(context.Context) error {
	e.p.calls.Add(1)
	return e.p.err
}

// Ping says what the engine answers, and after Close says ErrClosed
// without asking it.
func TestPingReportsTheEnginesAnswerUntilClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(pinging{err: fmt.Errorf("%w: no quorum", pubsub.ErrUnavailable), calls: &calls}))
		err := b.Ping(context.Background())
		if !errors.Is(err, pubsub.ErrUnavailable) || !strings.HasPrefix(fmt.Sprint(err), "logbus: ping: ") {
			t.Errorf("Ping: got %v, want ErrUnavailable behind \"logbus: ping: \"", err)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := b.Ping(context.Background()); !errors.Is(err, pubsub.ErrClosed) || errors.Is(err, pubsub.ErrUnavailable) {
			t.Errorf("Ping after Close: got %v, want ErrClosed only", err)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the engine was pinged %d times, want once: not after Close", n)
		}
	})
}

// A nil ctx is ErrInvalid for every lifecycle call.
func TestLifecycleCallsRefuseANilContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		g := mustSubscribe(t, topic, "billing", "b1", &recorder[string]{})
		var nilCtx context.Context
		_, discardErr := g.DiscardDeadLetters(nilCtx, nil)
		_, latestErr := g.LatestDeadLetters(nilCtx, 1)
		for name, err := range map[string]error{
			"DeleteGroup":        b.DeleteGroup(nilCtx, "billing", "orders"),
			"DeleteTopic":        b.DeleteTopic(nilCtx, "orders"),
			"Ping":               b.Ping(nilCtx),
			"DiscardDeadLetters": discardErr,
			"LatestDeadLetters":  latestErr,
		} {
			if !errors.Is(err, pubsub.ErrInvalid) {
				t.Errorf("%s(nil ctx): got %v, want ErrInvalid", name, err)
			}
		}
		if err := b.Ping(context.Background()); err != nil {
			t.Errorf("Ping: %v; the refused calls must have changed nothing", err)
		}
		if _, err := b.Group("billing", "orders"); err != nil {
			t.Errorf("the group after the refused calls: %v", err)
		}
	})
}

// DeleteGroup, DeleteTopic and DiscardDeadLetters are logged at Info as
// the other operator actions are (a topic's without a group), failures
// with their error; a deletion raises no rebalance.
func TestLifecycleCallsAreLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{level: slog.LevelInfo}
		ev := &events{}
		b := pubsubtest.NewBroker(t, pubsub.WithLogger(logs.logger()), pubsub.WithHooks(ev))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		g := deadLettered(t, b, topic, 2)
		if n, err := g.DiscardDeadLetters(context.Background(), nil); n != 2 || err != nil {
			t.Fatalf("DiscardDeadLetters: %d, %v", n, err)
		}
		rebalances := len(ev.with("rebalance"))
		if err := b.DeleteGroup(context.Background(), "billing", "orders"); err != nil {
			t.Fatal(err)
		}
		if err := b.DeleteGroup(context.Background(), "billing", "orders"); !errors.Is(err, pubsub.ErrSubscription) {
			t.Fatalf("DeleteGroup again: %v", err)
		}
		if err := b.DeleteTopic(context.Background(), "orders"); err != nil {
			t.Fatal(err)
		}
		if n := len(ev.with("rebalance")); n != rebalances {
			t.Errorf("the deletions raised %d rebalances, want none: %q", n-rebalances, ev.with("rebalance"))
		}
		discarded := logs.find("logbus: discarded dead letters")
		if len(discarded) != 1 || discarded[0].attrs["count"] != "2" || discarded[0].attrs["messaging.consumer.group.name"] != "billing" {
			t.Errorf("discard log: %v, want one record with count 2 for group billing", discarded)
		}
		groups := logs.find("logbus: deleted group")
		if len(groups) != 2 || groups[0].level != "INFO" || groups[0].attrs["error"] != "" ||
			!strings.Contains(groups[1].attrs["error"], "invalid subscription") {
			t.Errorf("deleted group logs: %v, want two at Info, the second with its error", groups)
		}
		topics := logs.find("logbus: deleted topic")
		if len(topics) != 1 || topics[0].attrs["messaging.destination.name"] != "orders" {
			t.Fatalf("deleted topic logs: %v, want one naming the topic", topics)
		}
		if _, ok := topics[0].attrs["messaging.consumer.group.name"]; ok {
			t.Errorf("the deleted topic's log names a group: %v", topics[0].attrs)
		}
	})
}

// A Stream whose group is deleted sees its channel close; a delivery it
// had not received is not handed over, and Close is then nil.
func TestDeleteGroupClosesAStreamWithADeliveryWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		s, err := topic.Stream("billing", "b1")
		if err != nil {
			t.Fatal(err)
		}
		mustPublishValue(t, topic, "a")
		synctest.Wait() // the delivery waits on C, unreceived
		if err := b.DeleteGroup(context.Background(), "billing", "orders"); err != nil {
			t.Fatalf("DeleteGroup: %v", err)
		}
		if d, ok := <-s.C(); ok {
			t.Errorf("Stream.C after DeleteGroup: got %q, want it closed", d.Value)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: %v", err)
		}
	})
}
