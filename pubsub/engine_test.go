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
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// lesser is the in-memory engine claiming fewer capabilities than it has,
// to stand in for an engine that lacks them.
type lesser struct{ caps engine.Capabilities }

func (l lesser) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := pubsub.InMemory().Open(cfg)
	return lesserEngine{e, l.caps}, err
}

type lesserEngine struct {
	engine.Engine
	caps engine.Capabilities
}

func (l lesserEngine) Capabilities() engine.Capabilities { return l.caps }

// An option that needs a capability the engine lacks is ErrInvalid, never
// silently ignored.
func TestOptionsAnEngineCannotHonourAreErrInvalid(t *testing.T) {
	clock := pubsubtest.NewClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
	for name, opt := range map[string]pubsub.BrokerOption{
		"WithClock": pubsub.WithClock(clock),
		"WithIDs":   pubsub.WithIDs(&seqIDs{}),
	} {
		t.Run(name, func(t *testing.T) {
			b := pubsub.NewBroker(pubsub.WithEngine(lesser{}), opt)
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			if err := b.Err(); !errors.Is(err, pubsub.ErrInvalid) {
				t.Errorf("Err: got %v, want ErrInvalid", err)
			}
			if _, err := pubsub.NewTopic(b, "t", codec.String(), codec.String()); !errors.Is(err, pubsub.ErrInvalid) {
				t.Errorf("NewTopic: got %v, want ErrInvalid", err)
			}
		})
	}
}

// The typed API works the same over any engine: the same topic, groups and
// routing over an engine that claims nothing but what every engine has.
func TestWithEngineRunsTheTypedAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithEngine(lesser{}))
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(4))
		var rec recorder[int]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		for i := range 8 {
			pos := mustPublish(t, topic, "alice", i)
			if want := int(crc32IEEE("alice") % 4); pos.Partition != want {
				t.Fatalf("alice landed on partition %d, want %d (CRC-32 routes above the engine)", pos.Partition, want)
			}
		}
		pubsubtest.Drain(t, b)
		if got := rec.values(); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("delivered %v, want 0..7 in order", got)
		}
	})
}

// Broker.Capabilities is what the engine declared; the in-memory engine
// declares every one.
func TestCapabilitiesAreTheEngines(t *testing.T) {
	if got := pubsub.NewBroker().Capabilities(); got != engine.AllCapabilities {
		t.Errorf("in memory: Capabilities() = %v, want %v", got, engine.AllCapabilities)
	}
	caps := engine.GiveBack | engine.MaxAge
	b := pubsub.NewBroker(pubsub.WithEngine(lesser{caps}))
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if got := b.Capabilities(); got != caps {
		t.Errorf("Capabilities() = %v, want the engine's %v", got, caps)
	}
}

// A retention the engine cannot keep is ErrInvalid at NewTopic, naming
// what it asked for; what the engine can keep is created.
func TestRetentionAnEngineCannotKeepIsErrInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    pubsub.Retention
		need engine.Capabilities
	}{
		{"OnFull DropOldest", pubsub.Retention{OnFull: pubsub.DropOldest}, engine.DropsOldest},
		{"MaxAge", pubsub.Retention{MaxAge: time.Minute}, engine.MaxAge},
		{"MaxBytes", pubsub.Retention{MaxBytes: 1 << 20}, engine.MaxBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := pubsub.NewBroker(pubsub.WithEngine(lesser{engine.AllCapabilities &^ tc.need}))
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			_, err := pubsub.NewTopic(b, "t", codec.String(), codec.String(), pubsub.WithRetention(tc.r))
			wantErrIs(t, "NewTopic", err, pubsub.ErrInvalid)
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("NewTopic: %v, want it to name %s", err, tc.name)
			}
			b2 := pubsub.NewBroker(pubsub.WithEngine(lesser{tc.need}))
			t.Cleanup(func() { _ = b2.Close(context.Background()) })
			if _, err := pubsub.NewTopic(b2, "t", codec.String(), codec.String(), pubsub.WithRetention(tc.r)); err != nil {
				t.Errorf("NewTopic on an engine with %v: %v", tc.need, err)
			}
		})
	}
}
