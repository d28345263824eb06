package pubsub

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"
)

type (
	retryOnly        struct{}
	deadLetterOnly   struct{}
	rebalanceOnly    struct{}
	backpressureOnly struct{}
	dropOnly         struct{}
	expireOnly       struct{}
	skipOnly         struct{}
	stuckOnly        struct{}
	publishOnly      struct{}
)

func (retryOnly) OnRetry(RetryEvent)                                           {}
func (deadLetterOnly) OnDeadLetter(DeadLetterEvent)                            {}
func (rebalanceOnly) OnRebalance(RebalanceEvent)                               {}
func (backpressureOnly) OnBackpressure(BackpressureEvent)                      {}
func (dropOnly) OnDrop(TrimEvent)                                              {}
func (expireOnly) OnExpire(TrimEvent)                                          {}
func (skipOnly) OnSkip(SkipEvent)                                              {}
func (stuckOnly) OnStuck(StuckEvent)                                           {}
func (publishOnly) OnPublished(context.Context, *PublishInfo, Position, error) {}

// The engine gets an observer exactly when something listens to the
// events only an engine sees: a hook for one of them, or a logger.
func TestEngineObserverOnlyWhenSomethingListens(t *testing.T) {
	if o, err := newObserver(nil, nil, 0); o != nil || err != nil {
		t.Fatalf("newObserver with nothing: %v, %v; want nil, nil", o, err)
	}
	engineHooks := []Hook{retryOnly{}, deadLetterOnly{}, rebalanceOnly{}, backpressureOnly{}, dropOnly{}, expireOnly{}, skipOnly{}, stuckOnly{}}
	for i := range engineHooks {
		for _, hooks := range [][]Hook{engineHooks[i : i+1], engineHooks[i:min(i+2, len(engineHooks))]} {
			o, err := newObserver(hooks, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if o.engineObserver() == nil {
				t.Errorf("hooks %T: the engine gets no observer", hooks)
			}
			if o.publishes || o.delivers || o.timed {
				t.Errorf("hooks %T: publishes %v delivers %v timed %v; want the publish and delivery paths left alone",
					hooks, o.publishes, o.delivers, o.timed)
			}
		}
	}
	o, err := newObserver([]Hook{publishOnly{}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.engineObserver() != nil {
		t.Error("a publish hook alone gives the engine an observer: it would pay for events nobody reads")
	}
	if !o.publishes || o.delivers || o.timed {
		t.Errorf("a published hook alone: publishes %v delivers %v timed %v; want true false false", o.publishes, o.delivers, o.timed)
	}
	if o, _ := newObserver(nil, slog.New(slog.DiscardHandler), 0); o.engineObserver() == nil || !o.delivers {
		t.Error("a logger: the engine gets no observer, or deliveries are not wrapped to log panics")
	}
	if _, err := newObserver([]Hook{struct{}{}}, nil, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("a value that hooks nothing: %v, want ErrInvalid", err)
	}
}

// A rate-limited warning is let through once per warnEvery per key, and
// then says how many it held back.
func TestLimiterLetsOneThroughPerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l limiter
		type step struct {
			wait time.Duration
			key  string
			ok   bool
			left int64
		}
		for i, s := range []step{
			{0, "a", true, 0},
			{0, "a", false, 0},
			{0, "b", true, 0}, // another key has its own interval
			{warnEvery / 2, "a", false, 0},
			{warnEvery / 2, "a", true, 2}, // exactly warnEvery after the last let through
			{warnEvery - 1, "a", false, 0},
		} {
			time.Sleep(s.wait)
			if ok, left := l.allow("dead letter", "orders", s.key, 0); ok != s.ok || left != s.left {
				t.Errorf("step %d: allow = %v, %d; want %v, %d", i, ok, left, s.ok, s.left)
			}
		}
	})
}
