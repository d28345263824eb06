// Package counting is an engine for logbus written outside logbus's own
// packages, on its public boundary alone (package engine), as an engine in
// another repository would be. It decorates another engine: it counts the
// calls the typed layer makes of it (topics created, groups joined,
// records appended, deliveries and batches handled) and refuses the topic
// names that match a pattern; everything else it hands to the engine it
// wraps. Its tests run logbus's conformance suite on it.
//
// A decorator keeps only the promises it passes on: it forwards every
// optional interface it knows (Snapshotter, Deleter, Pinger,
// BatchSubscriber, RecordIDer; the groups it hands out are the wrapped
// engine's own, with theirs) and declares of the wrapped engine's
// capabilities only those it knows it keeps, so a capability added to
// package engine later is not claimed by a decorator that never heard of
// it.
package counting

import (
	"context"
	"fmt"
	"path"
	"sync/atomic"

	"github.com/logbus/logbus/engine"
)

// Driver opens counting engines over the engines of another Driver. Pass
// it to pubsub.WithEngine. Its counts are those of every engine it opened.
type Driver struct {
	inner  engine.Driver
	refuse string // a path.Match pattern of topic names to refuse; "" refuses none
	counts counters
}

// Wrap returns a Driver whose engines decorate those of inner. A topic
// whose name matches refuse (a path.Match pattern, "" for none) is refused
// with an error wrapping engine.ErrInvalid; a malformed pattern refuses
// every topic.
func Wrap(inner engine.Driver, refuse string) *Driver {
	return &Driver{inner: inner, refuse: refuse}
}

// Counts is how often the typed layer called the engines of a Driver.
type Counts struct {
	Opened     int64 // engines opened: one per broker
	Topics     int64 // topics created
	Refused    int64 // topics refused for their name
	Subscribes int64 // consumers joined, per record or batch
	Appends    int64 // AppendOne and AppendBatch calls
	Records    int64 // records appended
	Deliveries int64 // handler calls
	Batches    int64 // batch handler calls
	Closes     int64 // Close calls
}

type counters struct {
	opened, topics, refused, subscribes, appends, records, deliveries, batches, closes atomic.Int64
}

// Counts returns the counts so far. Safe for concurrent use.
func (d *Driver) Counts() Counts {
	c := &d.counts
	return Counts{Opened: c.opened.Load(), Topics: c.topics.Load(), Refused: c.refused.Load(),
		Subscribes: c.subscribes.Load(), Appends: c.appends.Load(), Records: c.records.Load(),
		Deliveries: c.deliveries.Load(), Batches: c.batches.Load(), Closes: c.closes.Load()}
}

// Open opens the wrapped engine with cfg and decorates it.
func (d *Driver) Open(cfg engine.Config) (engine.Engine, error) {
	inner, err := d.inner.Open(cfg)
	if err != nil {
		return nil, err
	}
	d.counts.opened.Add(1)
	return &eng{inner: inner, d: d}, nil
}

// forwarded is every capability this decorator keeps when the engine it
// wraps does: the promises about records and time it passes on untouched,
// and those of the optional interfaces it forwards. (GaplessAsync too:
// its topics are no engine.AsyncAppender, so asynchronous publishes come
// through AppendOne, one at a time.)
const forwarded = engine.InjectedClock | engine.CustomIDs | engine.ExactBlock | engine.ReclaimOnCommit |
	engine.GiveBack | engine.VirtualTime | engine.Observed | engine.StuckDetection | engine.Batches |
	engine.DropsOldest | engine.MaxAge | engine.MaxBytes | engine.Snapshots | engine.Redrive |
	engine.Delete | engine.DiscardDeadLetters | engine.GaplessAsync | engine.KeyConcurrency

// eng is one decorated engine.
type eng struct {
	inner engine.Engine
	d     *Driver
}

var (
	_ engine.Engine          = (*eng)(nil)
	_ engine.Snapshotter     = (*eng)(nil)
	_ engine.Deleter         = (*eng)(nil)
	_ engine.Pinger          = (*eng)(nil)
	_ engine.BatchSubscriber = (*eng)(nil)
	_ engine.RecordIDer      = (*topic)(nil)
)

// Capabilities is what the wrapped engine keeps and this one passes on.
// An optional interface the wrapped engine lacks takes its capability
// with it.
func (e *eng) Capabilities() engine.Capabilities {
	caps := e.inner.Capabilities() & forwarded
	if _, ok := e.inner.(engine.Snapshotter); !ok {
		caps &^= engine.Snapshots
	}
	if _, ok := e.inner.(engine.Deleter); !ok {
		caps &^= engine.Delete
	}
	if _, ok := e.inner.(engine.BatchSubscriber); !ok {
		caps &^= engine.Batches
	}
	return caps
}

// CreateTopic refuses a name that matches the Driver's pattern, and
// otherwise creates the topic in the wrapped engine.
func (e *eng) CreateTopic(ctx context.Context, name string, spec engine.TopicSpec) (engine.Topic, error) {
	if e.d.refuse != "" {
		if match, err := path.Match(e.d.refuse, name); match || err != nil {
			e.d.counts.refused.Add(1)
			return nil, fmt.Errorf("%w: topic name %q is refused by this engine (pattern %q)", engine.ErrInvalid, name, e.d.refuse)
		}
	}
	t, err := e.inner.CreateTopic(ctx, name, spec)
	if err != nil {
		return nil, err
	}
	e.d.counts.topics.Add(1)
	return &topic{Topic: t, d: e.d}, nil
}

// Subscribe joins with a handler that counts its calls.
func (e *eng) Subscribe(ctx context.Context, topic, group, consumer string, h engine.Handler, onLeave func(), spec engine.GroupSpec) (engine.Group, error) {
	if h != nil {
		next := h
		h = func(ctx context.Context, d *engine.Delivery) error {
			e.d.counts.deliveries.Add(1)
			return next(ctx, d)
		}
	}
	g, err := e.inner.Subscribe(ctx, topic, group, consumer, h, onLeave, spec)
	if err == nil {
		e.d.counts.subscribes.Add(1)
	}
	return g, err
}

// SubscribeBatch joins a batch consumer with a handler that counts its
// calls; ErrInvalid when the wrapped engine delivers no batches.
func (e *eng) SubscribeBatch(ctx context.Context, topic, group, consumer string, h engine.BatchHandler, onLeave func(), spec engine.GroupSpec, batch engine.BatchSpec) (engine.Group, error) {
	bs, ok := e.inner.(engine.BatchSubscriber)
	if !ok {
		return nil, fmt.Errorf("%w: the wrapped engine delivers no batches", engine.ErrInvalid)
	}
	if h != nil {
		next := h
		h = func(ctx context.Context, b *engine.Batch) error {
			e.d.counts.batches.Add(1)
			return next(ctx, b)
		}
	}
	g, err := bs.SubscribeBatch(ctx, topic, group, consumer, h, onLeave, spec, batch)
	if err == nil {
		e.d.counts.subscribes.Add(1)
	}
	return g, err
}

func (e *eng) Group(ctx context.Context, topic, group string) (engine.Group, error) {
	return e.inner.Group(ctx, topic, group)
}

func (e *eng) Drain(ctx context.Context) error { return e.inner.Drain(ctx) }

func (e *eng) Close(ctx context.Context) error {
	e.d.counts.closes.Add(1)
	return e.inner.Close(ctx)
}

func (e *eng) State() engine.State { return e.inner.State() }

// Snapshot is the wrapped engine's, or an empty one when it has none (the
// typed layer does not ask then: Snapshots is not declared).
func (e *eng) Snapshot() engine.Snapshot {
	if s, ok := e.inner.(engine.Snapshotter); ok {
		return s.Snapshot()
	}
	return engine.Snapshot{}
}

func (e *eng) DeleteGroup(ctx context.Context, topic, group string) error {
	if d, ok := e.inner.(engine.Deleter); ok {
		return d.DeleteGroup(ctx, topic, group)
	}
	return fmt.Errorf("%w: the wrapped engine cannot delete groups", engine.ErrInvalid)
}

func (e *eng) DeleteTopic(ctx context.Context, topic string) error {
	if d, ok := e.inner.(engine.Deleter); ok {
		return d.DeleteTopic(ctx, topic)
	}
	return fmt.Errorf("%w: the wrapped engine cannot delete topics", engine.ErrInvalid)
}

// Ping is the wrapped engine's; nil when it depends on nothing.
func (e *eng) Ping(ctx context.Context) error {
	if p, ok := e.inner.(engine.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// topic counts the appends to a topic of the wrapped engine.
type topic struct {
	engine.Topic
	d *Driver
}

func (t *topic) AppendOne(ctx context.Context, partition int, rec *engine.Record) (int64, error) {
	t.d.counts.appends.Add(1)
	off, err := t.Topic.AppendOne(ctx, partition, rec)
	if err == nil {
		t.d.counts.records.Add(1)
	}
	return off, err
}

func (t *topic) AppendBatch(ctx context.Context, partitions []int, recs []*engine.Record, offsets []int64) (int, error) {
	t.d.counts.appends.Add(1)
	n, err := t.Topic.AppendBatch(ctx, partitions, recs, offsets)
	t.d.counts.records.Add(int64(n))
	return n, err
}

// RecordID is the wrapped topic's; "" when it cannot tell.
func (t *topic) RecordID(partition int, offset int64) string {
	if r, ok := t.Topic.(engine.RecordIDer); ok {
		return r.RecordID(partition, offset)
	}
	return ""
}
