package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newBroker returns a broker closed at cleanup; the cleanup fails the test
// if Close reports anything left undelivered unless allowUnfinished.
func newBroker(t *testing.T, cfg Config) *Broker {
	t.Helper()
	b, err := NewBroker(cfg)
	if err != nil {
		t.Fatalf("NewBroker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

func mustTopic(t *testing.T, b *Broker, name string, cfg TopicConfig) *Topic {
	t.Helper()
	topic, err := b.CreateTopic(name, cfg)
	if err != nil {
		t.Fatalf("CreateTopic(%q): %v", name, err)
	}
	return topic
}

func publish(t *testing.T, topic *Topic, key, value string) Position {
	t.Helper()
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	pos, err := topic.Publish(context.Background(), k, []byte(value), nil)
	if err != nil {
		t.Fatalf("Publish(%q, %q): %v", key, value, err)
	}
	return pos
}

func drain(t *testing.T, b *Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// delivery is one handler call seen by a recorder.
type delivery struct {
	consumer string
	rec      *Record // a copy: the log may reuse the record once committed
	shared   *Record // the record the handler was given, for identity only
	attempt  int
	err      error
}

// recorder is a handler factory that remembers every call, in order, and can
// fail on demand.
type recorder struct {
	mu    sync.Mutex
	calls []delivery
	// fail decides a call's outcome; nil acks everything.
	fail func(rec *Record, attempt int) error
}

func (r *recorder) handler(consumer string) Handler {
	return func(_ context.Context, rec *Record, attempt int, _ <-chan struct{}) error {
		var err error
		if r.fail != nil {
			err = r.fail(rec, attempt)
		}
		r.mu.Lock()
		kept := *rec
		r.calls = append(r.calls, delivery{consumer: consumer, rec: &kept, shared: rec, attempt: attempt, err: err})
		r.mu.Unlock()
		return err
	}
}

// acked returns the values acked, in order of acknowledgement.
func (r *recorder) acked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		if c.err == nil {
			out = append(out, string(c.rec.Value))
		}
	}
	return out
}

// ackedByKey returns the values acked for key, in order.
func (r *recorder) ackedByKey(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		if c.err == nil && string(c.rec.Key) == key {
			out = append(out, string(c.rec.Value))
		}
	}
	return out
}

func (r *recorder) attemptsOf(value string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if string(c.rec.Value) == value {
			n++
		}
	}
	return n
}

func (r *recorder) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func values(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// manualClock is a Clock the test moves by hand.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want one wrapping %v", err, target)
	}
}

// mustPause pauses g, waiting as long as its deliveries take.
func mustPause(t testing.TB, g *Group) {
	t.Helper()
	if err := g.Pause(context.Background()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
}
