package pubsubtest_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// fakeTB stands in for a test whose failures we want to observe rather
// than suffer: it records Errorf and Fatalf and holds the cleanups until
// runCleanups. Everything else goes to the real test it embeds.
type fakeTB struct {
	testing.TB

	mu       sync.Mutex
	errs     []string
	fatals   []string
	cleanups []func()
}

func newFakeTB(t *testing.T) *fakeTB { return &fakeTB{TB: t} }

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// Fatalf records and returns: the helpers under test return right after
// calling it, so there is nothing to stop.
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// runCleanups runs the cleanups last-registered first, as testing does.
func (f *fakeTB) runCleanups() {
	f.mu.Lock()
	fns := slices.Clone(f.cleanups)
	f.cleanups = nil
	f.mu.Unlock()
	for _, fn := range slices.Backward(fns) {
		fn()
	}
}

func (f *fakeTB) errors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.errs)
}

func (f *fakeTB) fatalErrors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.fatals)
}

func mustTopic(t *testing.T, b *pubsub.Broker, name string, opts ...pubsub.TopicOption) *pubsub.Topic[string, string] {
	t.Helper()
	topic, err := pubsub.NewTopic(b, name, codec.String(), codec.String(), opts...)
	if err != nil {
		t.Fatalf("NewTopic(%q): %v", name, err)
	}
	return topic
}

func mustSubscribe(t *testing.T, topic *pubsub.Topic[string, string], group string, h pubsub.Handler[string], opts ...pubsub.SubscribeOption) *pubsub.Group[string] {
	t.Helper()
	g, err := topic.Subscribe(group, group+"-1", h, opts...)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", group, err)
	}
	return g
}

func mustPublish(t *testing.T, topic *pubsub.Topic[string, string], key, value string) pubsub.Position {
	t.Helper()
	pos, err := topic.Publish(t.Context(), key, value)
	if err != nil {
		t.Fatalf("Publish(%q, %q): %v", key, value, err)
	}
	return pos
}
