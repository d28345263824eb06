package core

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
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

func mustTopic(t *testing.T, b *Broker, name string, cfg TopicSpec) *Topic {
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
	consumer  string
	partition int
	rec       *Record // a copy: the log may reuse the record once committed
	shared    *Record // the record the handler was given, for identity only
	attempt   int
	err       error
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
	return func(_ context.Context, d *Delivery) error {
		rec, attempt := d.Record, d.Attempt
		var err error
		if r.fail != nil {
			err = r.fail(rec, attempt)
		}
		r.mu.Lock()
		kept := *rec
		r.calls = append(r.calls, delivery{consumer: consumer, partition: d.Partition, rec: &kept, shared: rec, attempt: attempt, err: err})
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

// Position is where a record a test published landed.
type Position struct {
	Partition int
	Offset    int64
}

// testRouting spreads the keyless records of each topic round robin, as
// the typed layer's default partitioner does; keyed records go to the
// CRC-32 of their key.
var testRouting sync.Map // *Topic -> *atomic.Uint64

func (t *Topic) route(key []byte) int {
	if key != nil {
		return int(crc32.ChecksumIEEE(key) % uint32(len(t.parts)))
	}
	next, _ := testRouting.LoadOrStore(t, new(atomic.Uint64))
	return int((next.(*atomic.Uint64).Add(1) - 1) % uint64(len(t.parts)))
}

// Publish appends a record to the partition its key routes to, as the
// typed layer would, and returns where it landed.
func (t *Topic) Publish(ctx context.Context, key, value []byte, headers map[string]string) (Position, error) {
	rec := t.NewRecord()
	rec.Key, rec.Value, rec.Headers = key, value, headers
	p := t.route(key)
	offset, err := t.AppendOne(ctx, p, rec)
	if err != nil {
		return Position{}, err
	}
	return Position{Partition: p, Offset: offset}, nil
}

// PublishBatch publishes n records that fill fills, routed one by one as
// the typed layer would, telling landed where each went; it returns how
// many it stored.
func (t *Topic) PublishBatch(ctx context.Context, n int, fill func(i int, rec *Record) error, landed func(i int, pos Position)) (int, error) {
	recs := make([]*Record, n)
	parts := make([]int, n)
	for i := range recs {
		recs[i] = t.NewRecord()
		if err := fill(i, recs[i]); err != nil {
			return 0, err
		}
		parts[i] = t.route(recs[i].Key)
	}
	offsets := make([]int64, n)
	stored, err := t.AppendBatch(ctx, parts, recs, offsets)
	for i := range stored {
		if landed != nil {
			landed(i, Position{Partition: parts[i], Offset: offsets[i]})
		}
	}
	return stored, err
}

// lagOf is the lag of group on topic.
func lagOf(b *Broker, group, topic string) (int64, error) {
	g, err := b.Group(group, topic)
	if err != nil {
		return 0, err
	}
	return g.Lag(), nil
}

// replayGroup replays group on topic from start.
func replayGroup(b *Broker, group, topic string, from Start) error {
	g, err := b.Group(group, topic)
	if err != nil {
		return err
	}
	return g.Replay(context.Background(), from)
}
