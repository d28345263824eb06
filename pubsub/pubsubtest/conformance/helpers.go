package conformance

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// failureBound bounds every wait of the suite that a correct engine ends
// sooner: a stuck engine fails the subtest after it instead of hanging.
// Inside a bubble it is virtual, and expires at once when nothing else can
// happen.
const failureBound = 10 * time.Second

// shortWait is a context deadline, or a BlockTimeout, that must expire:
// short, since in real time the subtest waits it out.
const shortWait = 20 * time.Millisecond

// conf is one conformance subtest: its t, the engine under test, and
// whether it runs in a bubble.
type conf struct {
	*testing.T
	e      Engine
	bubble bool
	bound  context.Context // ends failureBound after the subtest began
}

func newConf(t *testing.T, e Engine, bubble bool) *conf {
	c := &conf{T: t, e: e, bubble: bubble}
	c.bound = c.within(failureBound)
	return c
}

// broker builds a broker of the engine under test.
func (c *conf) broker(opts ...pubsub.BrokerOption) *pubsub.Broker {
	c.Helper()
	b := c.e.NewBroker(c.T, opts...)
	if b == nil {
		c.Fatalf("engine %q: NewBroker returned nil", c.e.Name)
	}
	return b
}

// ctx returns a context that ends only when the subtest has run for
// failureBound: long after a correct engine is done.
func (c *conf) ctx() context.Context { return c.bound }

// within returns a context that ends after d.
func (c *conf) within(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	c.Cleanup(cancel)
	return ctx
}

// settle waits, inside a bubble, until every goroutine of the bubble is
// blocked, so that what the subtest checks next is the state the engine
// settled in. In real time it does nothing: a subtest calls it only where
// its checks hold whether or not the engine has settled yet, and the bubble
// just makes them sharper.
func (c *conf) settle() {
	if c.bubble {
		synctest.Wait()
	}
}

// drain waits until b's groups committed everything, failing the subtest
// if b.Drain says otherwise.
func (c *conf) drain(b *pubsub.Broker) {
	c.Helper()
	if err := b.Drain(c.ctx()); err != nil {
		c.Fatalf("Drain: %v", err)
	}
}

// wantIs fails the subtest unless err wraps every target.
func (c *conf) wantIs(what string, err error, targets ...error) {
	c.Helper()
	if err == nil {
		c.Errorf("%s: got nil, want an error wrapping %v", what, targets)
		return
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			c.Errorf("%s: got %v, want an error wrapping %v", what, err, target)
		}
	}
}

// topic creates a topic of string keys and values.
func (c *conf) topic(b *pubsub.Broker, name string, opts ...pubsub.TopicOption) *pubsub.Topic[string, string] {
	c.Helper()
	return newTopic(c, b, name, codec.String(), codec.String(), opts...)
}

// brokerTopic builds a broker of the engine under test and a topic of
// string keys and values on it: the pair most cases begin with.
func (c *conf) brokerTopic(name string, opts ...pubsub.TopicOption) (*pubsub.Broker, *pubsub.Topic[string, string]) {
	c.Helper()
	b := c.broker()
	return b, c.topic(b, name, opts...)
}

// clockedBrokerTopic is brokerTopic on a broker whose Clock is a test
// clock, starting at clockStart.
func (c *conf) clockedBrokerTopic(name string, opts ...pubsub.TopicOption) (*pubsubtest.Clock, *pubsub.Broker, *pubsub.Topic[string, string]) {
	c.Helper()
	clock := pubsubtest.NewClock(clockStart)
	b := c.broker(pubsub.WithClock(clock))
	return clock, b, c.topic(b, name, opts...)
}

func newTopic[K, V any](c *conf, b *pubsub.Broker, name string, keys codec.Codec[K], values codec.Codec[V], opts ...pubsub.TopicOption) *pubsub.Topic[K, V] {
	c.Helper()
	topic, err := pubsub.NewTopic(b, name, keys, values, opts...)
	if err != nil {
		c.Fatalf("NewTopic(%q): %v", name, err)
	}
	return topic
}

func publish[K, V any](c *conf, topic *pubsub.Topic[K, V], key K, value V, opts ...pubsub.PublishOption) pubsub.Position {
	c.Helper()
	pos, err := topic.Publish(c.ctx(), key, value, opts...)
	if err != nil {
		c.Fatalf("Publish(%v, %v): %v", key, value, err)
	}
	return pos
}

func publishValue[K, V any](c *conf, topic *pubsub.Topic[K, V], value V) pubsub.Position {
	c.Helper()
	pos, err := topic.PublishValue(c.ctx(), value)
	if err != nil {
		c.Fatalf("PublishValue(%v): %v", value, err)
	}
	return pos
}

// publishValues publishes each value, keyless, in order.
func publishValues[K, V any](c *conf, topic *pubsub.Topic[K, V], values ...V) {
	c.Helper()
	for _, v := range values {
		publishValue(c, topic, v)
	}
}

func subscribe[K, V any](c *conf, topic *pubsub.Topic[K, V], group, consumer string, h pubsub.Handler[V], opts ...pubsub.SubscribeOption) *pubsub.Group[V] {
	c.Helper()
	g, err := topic.Subscribe(group, consumer, h, opts...)
	if err != nil {
		c.Fatalf("Subscribe(%q, %q): %v", group, consumer, err)
	}
	return g
}

func stream[K, V any](c *conf, topic *pubsub.Topic[K, V], group, consumer string, opts ...pubsub.SubscribeOption) *pubsub.Stream[V] {
	c.Helper()
	s, err := topic.Stream(group, consumer, opts...)
	if err != nil {
		c.Fatalf("Stream(%q, %q): %v", group, consumer, err)
	}
	return s
}

// recv returns the stream's next delivery, failing the subtest if C closes
// or nothing comes within failureBound.
func recv[V any](c *conf, s *pubsub.Stream[V]) *pubsub.Delivery[V] {
	c.Helper()
	select {
	case d, ok := <-s.C():
		if !ok {
			c.Fatal("Stream.C: got closed, want a delivery")
		}
		return d
	case <-c.ctx().Done():
		c.Fatalf("Stream.C: got nothing within %v, want a delivery", failureBound)
	}
	return nil
}

// noDelivery fails the subtest if a delivery is waiting on C (after the
// engine settled, in a bubble).
func noDelivery[V any](c *conf, s *pubsub.Stream[V]) {
	c.Helper()
	c.settle()
	select {
	case d, ok := <-s.C():
		if ok {
			c.Fatalf("Stream.C: got %v (partition %d offset %d), want nothing", d.Value, d.Partition, d.Offset)
		}
		c.Fatal("Stream.C: got closed, want open and empty")
	default:
	}
}

// waitClosed waits for C to close, failing the subtest if a delivery comes
// first or C stays open for failureBound.
func waitClosed[V any](c *conf, s *pubsub.Stream[V]) {
	c.Helper()
	select {
	case d, ok := <-s.C():
		if ok {
			c.Fatalf("Stream.C: got a delivery (%v at offset %d), want it closed", d.Value, d.Offset)
		}
	case <-c.ctx().Done():
		c.Fatalf("Stream.C: still open after %v, want it closed", failureBound)
	}
}

func waitFor[V any](c *conf, r *pubsubtest.Recorder[V], n int) {
	c.Helper()
	if err := r.WaitFor(c.ctx(), n); err != nil {
		c.Fatal(err)
	}
}

// gate is a handler that holds every delivery until the subtest releases
// it: a group that commits nothing meanwhile. Build it after the broker:
// its cleanup, which releases it, then runs before the broker's Close.
type gate struct {
	entered  chan struct{} // closed when the first delivery began
	release  chan struct{}
	returned chan struct{} // closed when the first delivery's handler returned
	once     [3]sync.Once
	// honourCtx makes the handler return ctx's error when its context
	// ends; otherwise it ignores it.
	honourCtx bool
	ctxErr    chan error // the handler's ctx.Err when it returned, buffered
}

func newGate(c *conf, honourCtx bool) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{}), returned: make(chan struct{}),
		honourCtx: honourCtx, ctxErr: make(chan error, 1)}
	c.Cleanup(g.open)
	return g
}

// open releases every delivery, now and later. Idempotent.
func (g *gate) open() { g.once[1].Do(func() { close(g.release) }) }

func (g *gate) handler() pubsub.HandlerFunc[string] {
	return func(ctx context.Context, _ pubsub.Message[string]) error {
		g.once[0].Do(func() { close(g.entered) })
		defer g.once[2].Do(func() { close(g.returned) })
		var done <-chan struct{}
		if g.honourCtx {
			done = ctx.Done()
		}
		select {
		case <-g.release:
			return nil
		case <-done:
			g.ctxErr <- ctx.Err()
			return ctx.Err()
		}
	}
}

// wait waits for ch to close, failing the subtest after failureBound.
func (c *conf) wait(what string, ch <-chan struct{}) {
	c.Helper()
	select {
	case <-ch:
	case <-c.ctx().Done():
		c.Fatalf("%s: did not happen within %v", what, failureBound)
	}
}

// waitClosing waits until b's Close has begun: its state is no longer
// Running, which an engine sets before it drains. In a bubble the engine
// settles first and then must have begun; in real time the subtest yields
// to the goroutine that called Close until it has, for at most
// failureBound.
func (c *conf) waitClosing(b *pubsub.Broker) {
	c.Helper()
	c.settle()
	for b.State() == pubsub.Running {
		if c.bubble || c.ctx().Err() != nil {
			c.Fatal("Close was called, and the broker is still Running")
		}
		runtime.Gosched()
	}
}

// callLog is a handler that records every call, failed or not, and runs
// fail (when set) to decide its outcome.
type callLog[V any] struct {
	mu    sync.Mutex
	calls []pubsub.Message[V]
	fail  func(pubsub.Message[V]) error
}

func (l *callLog[V]) Handle(_ context.Context, msg pubsub.Message[V]) error {
	l.mu.Lock()
	l.calls = append(l.calls, msg)
	fail := l.fail
	l.mu.Unlock()
	if fail != nil {
		return fail(msg)
	}
	return nil
}

func (l *callLog[V]) all() []pubsub.Message[V] {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// values returns the values of msgs.
func values[V any](msgs []pubsub.Message[V]) []V {
	out := make([]V, len(msgs))
	for i, m := range msgs {
		out[i] = m.Value
	}
	return out
}

// attempts returns the Attempt of each message.
func attempts[V any](msgs []pubsub.Message[V]) []int {
	out := make([]int, len(msgs))
	for i, m := range msgs {
		out[i] = m.Attempt
	}
	return out
}

// accounted fails the subtest unless the topic's counters account for
// every record that left the log once.
func (c *conf) accounted(st pubsub.TopicStats) {
	c.Helper()
	if st.Published-int64(st.Retained) != st.Reclaimed+st.Dropped+st.Expired {
		c.Errorf("stats %+v: want Published − Retained == Reclaimed + Dropped + Expired", st)
	}
}

// keyPartition is where KeyHash sends key among n partitions.
func keyPartition(key string, n int) int { return int(crc32.ChecksumIEEE([]byte(key)) % uint32(n)) }

// cyclic reports whether parts visits the partitions in turn, each one
// after the one before it modulo n.
func cyclic(parts []int, n int) bool {
	for i := 1; i < len(parts); i++ {
		if parts[i] != (parts[i-1]+1)%n {
			return false
		}
	}
	return true
}

var (
	errBoom   = errors.New("conformance: boom")
	errPoison = errors.New("conformance: poison bytes")
	errEncode = errors.New("conformance: cannot encode this value")
)

// pickyStrings is a string codec whose Encode fails for "unencodable" and
// whose Decode fails for the bytes "poison".
func pickyStrings() codec.Codec[string] {
	return codec.Func(
		func(v string) ([]byte, error) {
			if v == "unencodable" {
				return nil, errEncode
			}
			return []byte(v), nil
		},
		func(data []byte) (string, error) {
			if string(data) == "poison" {
				return "", errPoison
			}
			return string(data), nil
		})
}

// partitionerFunc adapts a function to a [pubsub.Partitioner].
type partitionerFunc func(key []byte, partitions int) int

func (f partitionerFunc) Partition(key []byte, partitions int) int { return f(key, partitions) }

// seqIDs is an IDSource handing out "id-1", "id-2", ...
type seqIDs struct {
	mu sync.Mutex
	n  int
}

func (s *seqIDs) NextID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return fmt.Sprintf("id-%d", s.n)
}

// contains reports whether err's message has every one of parts.
func contains(err error, parts ...string) bool {
	if err == nil {
		return false
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			return false
		}
	}
	return true
}

// clockStart is the start of an injected clock's time.
var clockStart = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

// published is the outcome of a publish made by publishLater.
type published struct {
	pos pubsub.Position
	err error
}

// publishLater publishes value to topic on a goroutine of its own, bounded
// by the subtest's context: the channel gets the outcome.
func publishLater(c *conf, topic *pubsub.Topic[string, string], value string) <-chan published {
	out := make(chan published, 1)
	go func() { // exits when the publish returns
		pos, err := topic.PublishValue(c.ctx(), value)
		out <- published{pos, err}
	}()
	return out
}

// gatedLog subscribes billing/b1 to topic with a handler that logs every
// call and waits at a gate, then publishes a and b: the delivery of a
// waits at the gate, b behind it.
func gatedLog(c *conf, topic *pubsub.Topic[string, string]) (*gate, *callLog[string], *pubsub.Group[string]) {
	c.Helper()
	gt := newGate(c, false)
	h := gt.handler()
	log := &callLog[string]{fail: func(m pubsub.Message[string]) error { return h(context.Background(), m) }}
	g := subscribe(c, topic, "billing", "b1", log)
	publishValue(c, topic, "a")
	publishValue(c, topic, "b")
	return gt, log, g
}

// waitsForInFlight checks that call, what, made while a delivery waits at
// gt, returns only once that delivery has, and returns nil: it has not
// returned when everything else has settled, and gt's handler had
// returned when it did.
func waitsForInFlight(c *conf, gt *gate, what string, call func() error) {
	c.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }() // exits when call returns
	c.settle()
	select {
	case err := <-done:
		c.Fatalf("%s returned %v while a delivery was in flight, want it to wait", what, err)
	default:
	}
	gt.open()
	if err := <-done; err != nil {
		c.Fatalf("%s: %v", what, err)
	}
	select {
	case <-gt.returned:
	default:
		c.Errorf("%s returned before the delivery in flight had", what)
	}
}

// pausedWithLag subscribes billing/b1 to topic with a recorder, which gets
// a; then it pauses the group and publishes b and c, which wait.
func pausedWithLag(c *conf, b *pubsub.Broker, topic *pubsub.Topic[string, string]) (*pubsubtest.Recorder[string], *pubsub.Group[string]) {
	c.Helper()
	rec := pubsubtest.NewRecorder[string]()
	g := subscribe(c, topic, "billing", "b1", rec)
	publishValue(c, topic, "a")
	c.drain(b)
	if err := g.Pause(c.ctx()); err != nil {
		c.Fatalf("Pause: %v", err)
	}
	publishValue(c, topic, "b")
	publishValue(c, topic, "c")
	return rec, g
}

// wantGroupStats fails the subtest unless g's Stats are want.
func wantGroupStats[V any](c *conf, g *pubsub.Group[V], want pubsub.GroupStats) {
	c.Helper()
	if got := g.Stats(); got != want {
		c.Errorf("stats: got %+v, want %+v", got, want)
	}
}

// wantUnfinished fails the subtest unless err, Close's, is a
// *pubsub.ShutdownError that lists want.
func wantUnfinished(c *conf, err error, want ...pubsub.Unfinished) {
	c.Helper()
	se, ok := errors.AsType[*pubsub.ShutdownError](err)
	if !ok {
		c.Fatalf("Close: got %T (%v), want a *pubsub.ShutdownError", err, err)
	}
	if !slices.Equal(se.Unfinished, want) {
		c.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
	}
}

// lateCommittedNothing checks, once a handler Close gave up on has
// returned, that its deliveries committed nothing, and (in a bubble, where
// the engine has settled) were not counted Delivered.
func lateCommittedNothing[V any](c *conf, g *pubsub.Group[V], what string) {
	c.Helper()
	c.settle()
	if got := g.Committed(0); got != 0 {
		c.Errorf("the late %s committed: Committed(0) %d, want 0", what, got)
	}
	if c.bubble { // in real time the engine may still be taking the acks back
		if got := g.Stats().Delivered; got != 0 {
			c.Errorf("the late %s's acks counted: Delivered %d, want 0", what, got)
		}
	}
}

// subscribeLate subscribes a group created now, late/l1, to topic with a
// recorder, and drains b: the recorder has what the topic still held.
func subscribeLate(c *conf, b *pubsub.Broker, topic *pubsub.Topic[string, string]) (*pubsubtest.Recorder[string], *pubsub.Group[string]) {
	c.Helper()
	late := pubsubtest.NewRecorder[string]()
	g := subscribe(c, topic, "late", "l1", late)
	c.drain(b)
	return late, g
}

// overlaps counts the handler calls that overlap another of the same
// partition.
type overlaps struct {
	busy []atomic.Int32 // calls running, by partition
	n    atomic.Int32
}

func newOverlaps(parts int) *overlaps { return &overlaps{busy: make([]atomic.Int32, parts)} }

// enter marks a call of partition p begun, counting an overlap, and
// yields to give an overlapping call the chance to show; the returned
// func marks it ended.
func (o *overlaps) enter(p int) (leave func()) {
	if o.busy[p].Add(1) != 1 {
		o.n.Add(1)
	}
	runtime.Gosched()
	return func() { o.busy[p].Add(-1) }
}

// check fails the subtest when any of the calls, what, overlapped.
func (o *overlaps) check(c *conf, what string) {
	c.Helper()
	if n := o.n.Load(); n != 0 {
		c.Errorf("%d %s overlapped another of the same partition, want none", n, what)
	}
}

// callTimes records when each handler call began, as the time since it
// was made: virtual time, in a bubble.
type callTimes struct {
	start time.Time
	mu    sync.Mutex
	at    []time.Duration
}

func newCallTimes() *callTimes { return &callTimes{start: time.Now()} }

// mark records a call beginning now.
func (ct *callTimes) mark() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	ct.at = append(ct.at, time.Since(ct.start))
}

// all returns the calls' times, in order.
func (ct *callTimes) all() []time.Duration {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return slices.Clone(ct.at)
}
