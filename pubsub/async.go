package pubsub

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/logbus/logbus/engine"
)

// Pending is the outcome of one record published with [Topic.PublishAsync]
// or [Topic.PublishValueAsync]: where it was stored, or why it was not. It
// is resolved exactly once, and never changes afterwards. Its methods are
// safe for concurrent use. Only those calls make one: a Pending declared as
// a variable tells nothing.
type Pending struct {
	// A Pending is the one allocation of an asynchronous publish in
	// memory, so it is kept to 16 bytes without pointers, which the
	// garbage collector need not scan: the position, packed, and a state
	// word. A failed record's error is kept in failures, and a channel for
	// Done, made only for a Pending someone waits on before it resolves,
	// in waiting.
	offset    int64
	partition int32  // -1 when the record failed: failures has the error
	state     uint32 // pendingResolved, pendingOpen or pendingWaited; atomic once the Pending is shared
}

// failures holds the error of each failed Pending, until the Pending is
// collected. Keyed by weak pointer, so that it keeps no Pending alive, and
// a Pending made later at the same address is another key.
var failures sync.Map // weak.Pointer[Pending] -> error

// setErr keeps err as p's error, until p is collected.
func (p *Pending) setErr(err error) {
	w := weak.Make(p)
	failures.Store(w, err)
	runtime.AddCleanup(p, func(w weak.Pointer[Pending]) { failures.Delete(w) }, w)
}

// result returns p's outcome; p is resolved.
func (p *Pending) result() (Position, error) {
	if p.partition < 0 {
		if err, ok := failures.Load(weak.Make(p)); ok {
			return noPosition, err.(error)
		}
		panic("logbus: a failed Pending lost its error") // cannot be: the entry lives as long as p
	}
	return Position{Partition: int(p.partition), Offset: p.offset}, nil
}

// The states of a Pending. A Pending resolved when it is made is built
// with its state zero: no atomic store on the publisher's path.
const (
	pendingResolved uint32 = iota // offset and partition are final, and failures has the error of a failed one
	pendingOpen                   // not resolved, nobody waits
	pendingWaited                 // not resolved, a channel in waiting
)

// waiting holds the Done channel of each Pending that was waited on before
// it resolved.
var waiting sync.Map // *Pending -> chan struct{}

// closed is the channel Done returns for a resolved Pending: one for
// every Pending, so that resolving and asking cost no channel.
var closed = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

func (p *Pending) isResolved() bool { return atomic.LoadUint32(&p.state) == pendingResolved }

// Done returns a channel that is closed once the record's outcome is
// known; [Pending.Wait] then returns it at once. It never blocks.
func (p *Pending) Done() <-chan struct{} {
	if p.isResolved() {
		return closed
	}
	// Why no waiter is missed: Done puts its channel in waiting before it
	// moves the state from open to waited; resolve moves it from open to
	// resolved, or, when it finds it waited, takes the channel out of
	// waiting and closes it. Either resolve finds the state waited, and
	// then the channel is in waiting, or Done finds the state resolved and
	// returns a closed channel, taking out the channel it put there.
	v, _ := waiting.LoadOrStore(p, make(chan struct{}))
	ch := v.(chan struct{})
	if atomic.CompareAndSwapUint32(&p.state, pendingOpen, pendingWaited) || atomic.LoadUint32(&p.state) == pendingWaited {
		return ch
	}
	waiting.CompareAndDelete(p, ch) // resolved meanwhile, without seeing it
	return closed
}

// Wait waits until the record's outcome is known and returns it: where
// the record was stored, or the error that kept it out of the log (with
// the [Position] of no record). ctx bounds the wait only: when it ends
// first, Wait returns an error wrapping ctx's, and the record's fate is
// unchanged (wait again, or look at Done). A nil ctx is [ErrInvalid], also
// once the outcome is known.
func (p *Pending) Wait(ctx context.Context) (Position, error) {
	if ctx == nil {
		return noPosition, fail(errNilContext, "wait for a publish")
	}
	if !p.isResolved() {
		select {
		case <-p.Done():
		case <-ctx.Done():
			return noPosition, fail(ctx.Err(), "wait for a publish")
		}
	}
	return p.result()
}

// resolve sets the outcome and wakes the waiters. Called once, on a
// Pending made open.
func (p *Pending) resolve(pos Position, err error) {
	p.offset, p.partition = pos.Offset, int32(pos.Partition)
	if err != nil {
		p.offset, p.partition = -1, -1
		p.setErr(err)
	}
	if atomic.CompareAndSwapUint32(&p.state, pendingOpen, pendingResolved) {
		return // nobody waits
	}
	atomic.StoreUint32(&p.state, pendingResolved)
	if v, ok := waiting.LoadAndDelete(p); ok {
		close(v.(chan struct{}))
	}
}

// resolvedPending returns a Pending resolved with pos and err: the one
// allocation of an asynchronous publish that the engine stored at once.
func resolvedPending(pos Position, err error) *Pending {
	if err != nil {
		p := &Pending{offset: -1, partition: -1}
		p.setErr(err)
		return p
	}
	return &Pending{offset: pos.Offset, partition: int32(pos.Partition)}
}

// DefaultMaxInFlight is how many records [Topic.PublishAsync] keeps in
// flight per topic at most, unless [WithMaxInFlight] says otherwise.
const DefaultMaxInFlight = 4096

// WithMaxInFlight bounds the records of the topic that [Topic.PublishAsync]
// has handed to the engine and whose outcome is not known yet, overriding
// [DefaultMaxInFlight]. A remote engine needs about its rate times its
// round trip in flight: on loopback the JetStream engine publishes as fast
// with 256 as with 4096 (bench/README.md); 4096 leaves room for a slower
// link, at the price of holding as many records in memory. At the bound,
// PublishAsync waits for a record to resolve as [Block] waits for room,
// then resolves with [ErrBackpressure] or ctx's error (such waits are not
// counted in [TopicStats]). The in-memory engine stores a record before
// PublishAsync returns, so the bound never applies there. n < 1 is
// [ErrInvalid].
func WithMaxInFlight(n int) TopicOption {
	return topicOptionFunc(func(c *topicConfig) { c.maxInFlight, c.maxInFlightSet = n, true })
}

// asyncState is what a topic keeps for its asynchronous publishes.
type asyncState struct {
	// flushes counts the Flush calls begun: a record whose PublishAsync
	// began before a Flush has an epoch below the count that Flush took.
	flushes atomic.Uint64

	fmu      sync.Mutex   // guards failures
	failures []failureRun // failures no Flush has reported yet, by epoch

	// The rest is set for an engine that confirms records later (an
	// [engine.AsyncAppender]) and nil otherwise.
	name  string // the topic's
	app   engine.AsyncAppender
	slots chan struct{} // one element per record in flight: the bound of WithMaxInFlight
	parts []asyncPart   // by partition
	block time.Duration // the topic's BlockTimeout: the longest wait for a slot
}

// failureRun is the failures of records whose PublishAsync began in one
// epoch: how many, and the first one's error (without the "logbus:
// publish" prefix, which Flush puts its own in front of). Failures are
// counted rather than kept, so a publisher that never calls Flush holds
// one run, not an error per failure.
type failureRun struct {
	epoch uint64
	n     int
	first error
}

// asyncPart is one partition's asynchronous publishing.
type asyncPart struct {
	// mu makes the AppendAsync calls of the partition one at a time, so
	// that last is the last record the engine admitted: records resolve
	// in that order, so waiting for last waits for every record before
	// it. Held across AppendAsync, which does not wait (see
	// [engine.AsyncAppender]), and never by done.
	mu   sync.Mutex
	last *Pending
	_    [40]byte // a cache line each: partitions are published to at once
}

// failed notes the failure of a record whose PublishAsync began in epoch,
// for Flush. cause is the error without the "logbus: publish" prefix.
func (a *asyncState) failed(epoch uint64, cause error) {
	a.fmu.Lock()
	defer a.fmu.Unlock()
	if n := len(a.failures); n > 0 && a.failures[n-1].epoch == epoch {
		a.failures[n-1].n++
		return
	}
	a.failures = append(a.failures, failureRun{epoch: epoch, n: 1, first: cause})
}

// takeFailures removes and returns the failures of records whose
// PublishAsync began before epoch: how many, and the first one's cause.
func (a *asyncState) takeFailures(epoch uint64) (int, error) {
	a.fmu.Lock()
	defer a.fmu.Unlock()
	var n int
	var first error
	kept := a.failures[:0]
	for _, r := range a.failures {
		if r.epoch >= epoch {
			kept = append(kept, r)
			continue
		}
		if first == nil {
			first = r.first
		}
		n += r.n
	}
	clear(a.failures[len(kept):])
	a.failures = kept
	return n, first
}

// wait waits until every record the engine admitted before the call has
// resolved, at most until ctx ends.
func (a *asyncState) wait(ctx context.Context) error {
	for i := range a.parts {
		if err := a.waitPartition(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// waitPartition waits until every record of partition p the engine
// admitted before the call has resolved, at most until ctx ends. Publish
// and PublishBatch call it first, so that a record published after
// asynchronous ones (from one goroutine) is stored after them.
func (a *asyncState) waitPartition(ctx context.Context, p int) error {
	if a.parts == nil {
		return nil
	}
	part := &a.parts[p]
	part.mu.Lock()
	last := part.last
	part.mu.Unlock()
	if last == nil || last.isResolved() {
		return nil
	}
	select {
	case <-last.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("topic %q partition %d: waiting for the asynchronous records ahead: %w", a.name, p, ctx.Err())
	}
}

// admit takes a slot for a record in flight, waiting for one as Block
// waits for room: at most block, never past ctx or the broker's Close.
func (a *asyncState) admit(ctx context.Context, stopping <-chan struct{}) error {
	select {
	case a.slots <- struct{}{}:
		return nil
	default:
	}
	timer := time.NewTimer(a.block)
	defer timer.Stop()
	select {
	case a.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for one of %d records in flight (WithMaxInFlight) to resolve: %w", cap(a.slots), ctx.Err())
	case <-stopping:
		return ErrClosed
	case <-timer.C:
		return fmt.Errorf("%w: %d records in flight (WithMaxInFlight) for %v", ErrBackpressure, cap(a.slots), a.block)
	}
}

// release frees the slot of a record that resolved.
func (a *asyncState) release() { <-a.slots }

// newAsyncState returns a topic's asynchronous state: with a bound and
// partitions when the engine topic t confirms records later.
func newAsyncState(t engine.Topic, cfg topicConfig) *asyncState {
	a := &asyncState{}
	app, ok := t.(engine.AsyncAppender)
	if !ok {
		return a
	}
	a.app, a.name = app, t.Name()
	a.slots = make(chan struct{}, cfg.maxInFlight)
	a.parts = make([]asyncPart, t.Partitions())
	a.block = cfg.Retention.BlockTimeout
	if a.block == 0 {
		a.block = engine.DefaultBlockTimeout
	}
	return a
}

// PublishAsync publishes a record as [Topic.Publish] does, without waiting
// for the engine to confirm it: it returns a [Pending] that resolves once
// the record is stored (with its Position) or has failed (with the error
// Publish would have returned). It keeps many records in flight to an
// engine with a round trip per record (JetStream); in memory the record is
// stored before PublishAsync returns, and a Pending is its only cost (one
// allocation).
//
// ctx governs admission only: PublishAsync encodes and routes the record
// at once (an error there resolves the Pending at once, nothing appended),
// then waits, if it must, for room under [Block] (in memory) or at the
// topic's [WithMaxInFlight] bound. Once the record is handed to the engine
// cancelling ctx fails nothing. A nil ctx resolves with [ErrInvalid]; after
// Close began, PublishAsync resolves with [ErrClosed].
//
// Order: the records of one partition are stored in the order their
// PublishAsync calls were made (calls from one goroutine; calls from
// several race, as Publish calls do), and an engine's retries never
// reorder them. Publish and PublishBatch keep that order too: they first
// wait for the asynchronous records ahead of them in their partitions to
// resolve. When a record fails with its own cause, the records of its
// partition issued before its failure resolved and not yet stored fail
// too, wrapping [ErrAborted] and that cause, so what a partition stored is
// a prefix of what was issued; a record issued after the failure resolved
// is tried afresh. An engine that cannot tell whether a record was stored
// (a connection lost with the record sent) fails it with
// [ErrOutcomeUnknown]: it may be stored, and records behind it may have
// been stored after a gap (see the engine's documentation; the in-memory
// engine stores or fails every record exactly).
//
// Every Pending resolves, within a bound the engine documents. [Topic.Flush]
// waits for the records issued before it and reports the failures;
// [Broker.Drain] and [Broker.Close] wait for every record in flight first.
// [HookPublish] sees the record before it is handed to the engine, and
// [HookPublished] when it resolves, before Done closes.
func (t *Topic[K, V]) PublishAsync(ctx context.Context, key K, value V, opts ...PublishOption) *Pending {
	epoch := t.async.flushes.Load()
	rec := t.eng.NewRecord()
	if err := t.encodeKey(rec, key); err != nil {
		return t.failedAsync(epoch, err)
	}
	return t.publishAsync(ctx, epoch, rec, value, opts)
}

// PublishValueAsync is [Topic.PublishAsync] for a keyless record, spread by
// the partitioner as [Topic.PublishValue]'s are.
func (t *Topic[K, V]) PublishValueAsync(ctx context.Context, value V, opts ...PublishOption) *Pending {
	epoch := t.async.flushes.Load()
	rec := t.eng.NewRecord()
	rec.Key = nil // keyless
	return t.publishAsync(ctx, epoch, rec, value, opts)
}

// publishAsync is the rest of PublishAsync once rec has its key.
func (t *Topic[K, V]) publishAsync(ctx context.Context, epoch uint64, rec *engine.Record, value V, opts []PublishOption) *Pending {
	p, err := t.prepare(ctx, rec, value, opts)
	if err != nil {
		return t.failedAsync(epoch, err)
	}
	if t.async.app == nil {
		pos, err := t.appendOne(ctx, p, rec)
		if err != nil {
			return t.failedAsync(epoch, err)
		}
		return resolvedPending(pos, nil)
	}
	return t.issue(ctx, epoch, p, rec)
}

// failedAsync returns a Pending resolved with cause, and counts it for
// Flush.
func (t *Topic[K, V]) failedAsync(epoch uint64, cause error) *Pending {
	t.async.failed(epoch, cause)
	return resolvedPending(noPosition, fail(cause, "publish to topic %q", t.Name()))
}

// issue hands rec, routed to partition p, to an engine that confirms it
// later, once the topic's in-flight bound admits it.
func (t *Topic[K, V]) issue(ctx context.Context, epoch uint64, p int, rec *engine.Record) *Pending {
	a := t.async
	pd := &Pending{state: pendingOpen}
	var info *PublishInfo
	hctx := ctx
	if o := t.b.obs; o != nil && o.publishes {
		info = &PublishInfo{Topic: t.Name(), Partition: p, Key: rec.Key, Size: len(rec.Key) + len(rec.Value), Headers: rec.Headers}
		hctx = o.onPublish(ctx, info)
		rec.Headers, info.Key = info.Headers, nil // the record is the engine's once appended
	}
	done := func(offset int64, err error) {
		a.release()
		t.settle(pd, epoch, p, offset, err, info, hctx)
	}
	if t.b.closing.Load() {
		t.settle(pd, epoch, p, -1, ErrClosed, info, hctx)
		return pd
	}
	if err := a.admit(ctx, t.b.stopping); err != nil {
		t.settle(pd, epoch, p, -1, err, info, hctx)
		return pd
	}
	part := &a.parts[p]
	part.mu.Lock()
	err := a.app.AppendAsync(ctx, p, rec, done)
	if err == nil {
		part.last = pd
	}
	part.mu.Unlock()
	if err != nil {
		a.release()
		t.settle(pd, epoch, p, -1, err, info, hctx)
	}
	return pd
}

// settle resolves pd, the record of partition p that the engine stored at
// offset or failed with err, whose PublishAsync began in epoch: it counts a
// failure for Flush, then raises [HookPublished], then resolves, so that
// whoever waited on pd finds both done.
func (t *Topic[K, V]) settle(pd *Pending, epoch uint64, p int, offset int64, err error, info *PublishInfo, hctx context.Context) {
	pos := Position{Partition: p, Offset: offset}
	if err != nil {
		t.async.failed(epoch, err)
		pos, err = noPosition, fail(err, "publish to topic %q", t.Name())
	}
	if info != nil {
		if err == nil {
			info.ID = t.recordID(pos)
		}
		t.b.obs.onPublished(hctx, info, pos, err)
	}
	pd.resolve(pos, err)
}

// Flush waits until every record published with [Topic.PublishAsync] (or
// PublishValueAsync) on this topic before the call has resolved, at most
// until ctx ends. It returns nil when all of them were stored, and
// otherwise an error that says how many failed and wraps the first
// failure. Each failure is reported by one Flush only. Records published
// while Flush waits may be reported by this Flush or the next.
//
// When ctx ends first, Flush returns an error wrapping ctx's, and reports
// the failures at its next call. A nil ctx is [ErrInvalid]. Flush works
// after Close too (it reports what failed, [ErrClosed] included). From a
// hook, see [Hook].
func (t *Topic[K, V]) Flush(ctx context.Context) error {
	if ctx == nil {
		return fail(errNilContext, "flush topic %q", t.Name())
	}
	a := t.async
	epoch := a.flushes.Add(1)
	if err := a.wait(ctx); err != nil {
		return fail(err, "flush topic %q", t.Name())
	}
	n, first := a.takeFailures(epoch)
	switch n {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("logbus: flush topic %q: 1 record failed: %w", t.Name(), first)
	}
	return fmt.Errorf("logbus: flush topic %q: %d records failed, the first: %w", t.Name(), n, first)
}

// inFlight is the set of a broker's topics whose engine confirms
// PublishAsync's records later, for Drain and Close to wait on.
type inFlight struct {
	mu     sync.Mutex
	topics []*asyncState
}

func (f *inFlight) add(a *asyncState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.topics = append(f.topics, a)
}

func (f *inFlight) remove(a *asyncState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.topics {
		if x == a {
			f.topics = append(f.topics[:i], f.topics[i+1:]...)
			return
		}
	}
}

// wait waits until every record in flight when it was called has
// resolved, at most until ctx ends.
func (f *inFlight) wait(ctx context.Context) error {
	f.mu.Lock()
	topics := append([]*asyncState(nil), f.topics...)
	f.mu.Unlock()
	for _, a := range topics {
		if err := a.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}
