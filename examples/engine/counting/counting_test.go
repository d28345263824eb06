package counting_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/examples/engine/counting"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newBroker builds a broker on a counting engine over the in-memory one,
// refusing the topics named "internal.*".
func newBroker(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
	return pubsubtest.NewBroker(tb, append(opts, pubsub.WithEngine(counting.Wrap(pubsub.InMemory(), "internal.*")))...)
}

// An engine written outside logbus's packages keeps every promise of the
// conformance suite: the decorator passes on every capability of the
// in-memory engine, so the whole suite runs, in testing/synctest bubbles.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t, conformance.Engine{Name: "counting over memory", NewBroker: newBroker})
}

// The decorator declares what the engine it wraps keeps, and no more: over
// an engine without optional interfaces it declares none of theirs.
func TestCapabilitiesAreTheWrappedEnginesItPassesOn(t *testing.T) {
	b := newBroker(t)
	if got := b.Capabilities(); got != engine.AllCapabilities {
		t.Errorf("over memory: %v, want every capability, %v", got, engine.AllCapabilities)
	}
	bare := pubsubtest.NewBroker(t, pubsub.WithEngine(counting.Wrap(bareEngine{}, "")))
	if got, want := bare.Capabilities(), engine.VirtualTime|engine.GiveBack; got != want {
		t.Errorf("over an engine without optional interfaces: %v, want %v", got, want)
	}
}

// Every call the typed layer makes is counted, and a refused name is
// ErrInvalid at NewTopic.
func TestCountsEveryCallAndRefusesAPattern(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := counting.Wrap(pubsub.InMemory(), "internal.*")
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(d))
		if _, err := pubsub.NewTopic(b, "internal.audit", codec.String(), codec.String()); !errors.Is(err, pubsub.ErrInvalid) {
			t.Errorf("NewTopic of a refused name: %v, want ErrInvalid", err)
		}
		topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(2))
		if err != nil {
			t.Fatal(err)
		}
		rec := pubsubtest.NewRecorder[string]()
		if _, err := topic.Subscribe("billing", "b1", rec); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, v := range []string{"a", "b", "c"} {
			if _, err := topic.PublishValue(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := topic.PublishBatch(ctx, []pubsub.Entry[string, string]{{Key: "x", Value: "d"}, {Key: "x", Value: "e"}}); err != nil {
			t.Fatal(err)
		}
		pubsubtest.Drain(t, b)
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		want := counting.Counts{Opened: 1, Topics: 1, Refused: 1, Subscribes: 1, Appends: 4, Records: 5, Deliveries: 5, Closes: 1}
		if got := d.Counts(); got != want {
			t.Errorf("counts %+v, want %+v", got, want)
		}
	})
}

// bareEngine is the in-memory engine behind engine.Engine alone: none of
// its optional interfaces, and of its capabilities only some.
type bareEngine struct{}

func (bareEngine) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	return bare{e}, err
}

type bare struct{ engine.Engine }

func (bare) Capabilities() engine.Capabilities {
	return engine.VirtualTime | engine.GiveBack | engine.Snapshots | engine.Delete | engine.Batches
}
