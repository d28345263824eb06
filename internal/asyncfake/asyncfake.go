// Package asyncfake wraps the in-memory engine in one whose topics confirm
// records later (engine.AsyncAppender), as a remote engine does: for the
// tests of the typed layer's asynchronous publishing (pubsub.PublishAsync,
// Flush, Drain and Close waiting for records in flight), which the
// in-memory engine never exercises, since it stores a record before
// PublishAsync returns. It keeps the promises of engine.AsyncAppender and
// GaplessAsync exactly, and runs in a testing/synctest bubble. Only tests
// import it.
package asyncfake

import (
	"context"
	"fmt"
	"sync"

	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/internal/core"
)

// Driver opens the wrapped engine. Hold, when set, makes every partition
// confirm nothing until it is closed (records pile up in flight); Fail,
// when set, is asked about each record before it is appended, and the
// record fails with the error it returns instead.
type Driver struct {
	Hold <-chan struct{}
	Fail func(partition int, rec *engine.Record) error
}

// Open opens an in-memory engine and wraps it.
func (d *Driver) Open(cfg engine.Config) (engine.Engine, error) {
	inner, err := core.NewEngine(cfg)
	if err != nil {
		return nil, err
	}
	e := &eng{Engine: inner, d: d, stop: make(chan struct{})}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// eng is the wrapped engine. Its optional abilities are the in-memory
// engine's, forwarded.
type eng struct {
	engine.Engine
	d    *Driver
	stop chan struct{} // closed by Close: the partitions' goroutines fail what is left and exit
	// ctx ends with Close: it bounds the appends the partitions' goroutines
	// make, which wait for room under Block.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

func (e *eng) CreateTopic(ctx context.Context, name string, spec engine.TopicSpec) (engine.Topic, error) {
	t, err := e.Engine.CreateTopic(ctx, name, spec)
	if err != nil {
		return nil, err
	}
	at := &topic{Topic: t, e: e, parts: make([]*part, t.Partitions())}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range at.parts {
		pt := &part{t: at, p: i, wake: make(chan struct{}, 1)}
		at.parts[i] = pt
		if !e.closed {
			e.wg.Go(pt.run) // exits when Close closes stop, having failed what was left
		}
	}
	return at, nil
}

// Close stops confirming: records still in flight fail with ErrClosed
// (wrapping ErrOutcomeUnknown, as a remote engine's would), then the
// in-memory engine closes.
func (e *eng) Close(ctx context.Context) error {
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		close(e.stop)
		e.cancel()
	}
	e.mu.Unlock()
	e.wg.Wait()
	return e.Engine.Close(ctx)
}

func (e *eng) Snapshot() engine.Snapshot { return e.Engine.(engine.Snapshotter).Snapshot() }

func (e *eng) DeleteGroup(ctx context.Context, topic, group string) error {
	return e.Engine.(engine.Deleter).DeleteGroup(ctx, topic, group)
}

func (e *eng) DeleteTopic(ctx context.Context, topic string) error {
	return e.Engine.(engine.Deleter).DeleteTopic(ctx, topic)
}

func (e *eng) SubscribeBatch(ctx context.Context, topic, group, consumer string, h engine.BatchHandler, onLeave func(), spec engine.GroupSpec, batch engine.BatchSpec) (engine.Group, error) {
	return e.Engine.(engine.BatchSubscriber).SubscribeBatch(ctx, topic, group, consumer, h, onLeave, spec, batch)
}

// topic confirms its records later, one goroutine per partition.
type topic struct {
	engine.Topic
	e     *eng
	parts []*part
}

func (t *topic) RecordID(partition int, offset int64) string {
	return t.Topic.(engine.RecordIDer).RecordID(partition, offset)
}

// item is a record in flight.
type item struct {
	rec  *engine.Record
	done func(int64, error)
}

// part is one partition's records in flight, appended in order by run.
type part struct {
	t    *topic
	p    int
	wake chan struct{} // a token when queue grew

	mu     sync.Mutex
	queue  []item
	closed bool // set by failAll: AppendAsync refuses from then on
}

func (t *topic) AppendAsync(ctx context.Context, p int, rec *engine.Record, done func(int64, error)) error {
	if p < 0 || p >= len(t.parts) {
		return fmt.Errorf("%w: no partition %d", engine.ErrInvalid, p)
	}
	pt := t.parts[p]
	pt.mu.Lock()
	if pt.closed {
		pt.mu.Unlock()
		return fmt.Errorf("partition %d: %w", p, engine.ErrClosed)
	}
	pt.queue = append(pt.queue, item{rec, done})
	pt.mu.Unlock()
	select {
	case pt.wake <- struct{}{}:
	default:
	}
	return nil
}

// run appends the partition's records in order and confirms each. When
// one fails, every record queued behind it at that moment fails with
// ErrAborted: they were appended before its failure was reported.
func (pt *part) run() {
	e := pt.t.e
	for {
		select {
		case <-pt.wake:
		case <-e.stop:
			pt.failAll(fmt.Errorf("partition %d: %w: %w", pt.p, engine.ErrOutcomeUnknown, engine.ErrClosed))
			return
		}
		if e.d.Hold != nil {
			select {
			case <-e.d.Hold:
			case <-e.stop:
				pt.failAll(fmt.Errorf("partition %d: %w: %w", pt.p, engine.ErrOutcomeUnknown, engine.ErrClosed))
				return
			}
		}
		for {
			pt.mu.Lock()
			if len(pt.queue) == 0 {
				pt.mu.Unlock()
				break
			}
			it := pt.queue[0]
			pt.queue = pt.queue[1:]
			pt.mu.Unlock()
			var err error
			if e.d.Fail != nil {
				err = e.d.Fail(pt.p, it.rec)
			}
			var off int64 = -1
			if err == nil {
				// The engine's own wait for room under Block: bounded by
				// BlockTimeout, and by Close.
				off, err = pt.t.Topic.AppendOne(e.ctx, pt.p, it.rec)
			}
			if err == nil {
				it.done(off, nil)
				continue
			}
			pt.mu.Lock()
			behind := pt.queue
			pt.queue = nil
			pt.mu.Unlock()
			it.done(-1, err)
			for _, b := range behind {
				b.done(-1, fmt.Errorf("partition %d: %w: %w", pt.p, engine.ErrAborted, err))
			}
		}
	}
}

// failAll fails every record still queued with err, and refuses the
// records that come later.
func (pt *part) failAll(err error) {
	pt.mu.Lock()
	left := pt.queue
	pt.queue, pt.closed = nil, true
	pt.mu.Unlock()
	for _, it := range left {
		it.done(-1, err)
	}
}
