package pubsub

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
)

// Handler processes the messages of one consumer. Returning nil acks the
// message: its offset is committed and the next message of the partition
// follows. Returning an error, or panicking ([PanicError]), nacks it: the
// message is retried and then dead-lettered as the group's [RetryPolicy]
// says, and an error wrapping [ErrPermanent] skips the retries.
//
// Handle runs on the worker goroutine of the message's partition, so calls
// for one partition never overlap and come in offset order; calls for
// different partitions run concurrently. A group with WithKeyConcurrency
// runs up to n calls of one partition at once, on goroutines its worker
// owns, never two with equal keys: see there. Delivery is at least once
// (the Delivery section of [github.com/logbus/logbus] says when a message
// comes again), so a handler must be idempotent: [Message.ID] is a stable
// key.
//
// ctx is cancelled only when [Broker.Close] gives up on draining; a handler
// must return soon after (one that does not is left running, and commits
// nothing). The calls that wait for deliveries in flight ([Group.Leave],
// Pause, Seek and Replay, [Broker.DeleteGroup], DeleteTopic and Close),
// made by a handler on its own group, wait for that handler until their
// ctx ends: give them a ctx with a deadline, or call them from another
// goroutine.
type Handler[V any] interface {
	Handle(ctx context.Context, msg Message[V]) error
}

// HandlerFunc adapts a function to a [Handler].
type HandlerFunc[V any] func(ctx context.Context, msg Message[V]) error

// Handle calls f(ctx, msg).
func (f HandlerFunc[V]) Handle(ctx context.Context, msg Message[V]) error { return f(ctx, msg) }

// Message is one record as a consumer sees it. Key and Headers are the
// consumer's own copies: changing them changes nothing for anyone else. A
// short Key shares one allocation with the keys of other messages of its
// partition (as ID shares one with other IDs), so keeping a Key keeps up
// to 1 KiB alive; copy it to keep many. Value is the consumer's own too,
// except with [codec.RawBytes], where it is the log's memory and valid only
// until the handler returns.
type Message[V any] struct {
	ID        string // unique per record, the same for every group and every redelivery (see WithIDs)
	Topic     string
	Partition int
	Offset    int64
	Key       []byte // the encoded key; nil for keyless messages
	Value     V
	Headers   map[string]string
	Created   time.Time // when it was published, by the broker's Clock (see WithClock)
	Attempt   int       // 1 on the first delivery to this group; counts up on redelivery
}

// handOver calls handle with the Message of d, whose value is value.
// keys, when not nil, is where its key is copied to. The Message is built
// in the call's arguments rather than returned by a constructor: it is 136
// bytes, and a constructor costs a copy of it per delivery.
func handOver[V any](ctx context.Context, handle func(context.Context, Message[V]) error, d *engine.Delivery, value V, keys *keyArena) error {
	return handle(ctx, Message[V]{
		ID:        d.ID,
		Topic:     d.Topic,
		Partition: d.Partition,
		Offset:    d.Record.Offset,
		Key:       keys.clone(d.Record.Key), // the record is shared by every group
		Value:     value,
		Headers:   maps.Clone(d.Record.Headers),
		Created:   d.Record.Created,
		Attempt:   d.Attempt,
	})
}

// SubscribeOption configures the group that [Topic.Subscribe],
// [Topic.Stream] or [Topic.SubscribeBatch] creates. A group's configuration
// is fixed by the call that created it: joining an existing group with
// options that differ from its own, [StartAt] included, is an error
// wrapping [ErrSubscription], so two replicas of a service cannot disagree
// silently.
type SubscribeOption interface{ applySubscribe(*subscribeConfig) }

// subscribeConfig is what the options of Subscribe, Stream and
// SubscribeBatch record: the group's spec, the batch consumer's, and the
// first invalid value, which the call reports.
type subscribeConfig struct {
	engine.GroupSpec
	batch     engine.BatchSpec
	batchSize bool // WithBatchSize was given: then 0 is ErrInvalid, not the default
	err       error
}

type subscribeOptionFunc func(*subscribeConfig)

func (f subscribeOptionFunc) applySubscribe(c *subscribeConfig) { f(c) }

// invalid records err unless an earlier option was invalid already.
func (c *subscribeConfig) invalid(err error) {
	if c.err == nil {
		c.err = err
	}
}

// applySubscribeOptions applies opts to a config; a nil option is
// ErrInvalid, reported by the call, never a panic.
func applySubscribeOptions(opts []SubscribeOption) subscribeConfig {
	var cfg subscribeConfig
	for i, o := range opts {
		if o == nil {
			cfg.invalid(fmt.Errorf("%w: option %d is nil", ErrInvalid, i))
			continue
		}
		o.applySubscribe(&cfg)
	}
	return cfg
}

// WithGroupRetry sets this group's retry policy, overriding the broker's
// ([WithRetry]).
func WithGroupRetry(p RetryPolicy) SubscribeOption {
	return subscribeOptionFunc(func(c *subscribeConfig) { c.Retry = p.engine() })
}

// WithDeadLetterLimit sets how many dead letters the group keeps, overriding
// the default of 1024. When full, the oldest is evicted and counted in
// [GroupStats.DeadLettersEvicted]. 0 keeps none: each record given up on is
// still counted in GroupStats.DeadLettered and DeadLettersEvicted and
// raises the dead-letter hooks and log line, but [Group.DeadLetters] stays
// empty and there is nothing to Redrive. Negative is [ErrInvalid].
func WithDeadLetterLimit(n int) SubscribeOption {
	return subscribeOptionFunc(func(c *subscribeConfig) {
		switch {
		case n < 0:
			c.invalid(fmt.Errorf("%w: WithDeadLetterLimit(%d): negative", ErrInvalid, n))
		case n == 0:
			c.DeadLetterLimit = engine.NoDeadLetters
		default:
			c.DeadLetterLimit = n
		}
	})
}

// MaxKeyConcurrency is the most deliveries of one partition
// WithKeyConcurrency lets a group run at once.
const MaxKeyConcurrency = 256

// WithKeyConcurrency lets a group's worker run up to n deliveries of one
// partition at once, never two with equal keys, overriding the default of
// one at a time: the Handler of a group whose records go to slow I/O (an
// HTTP call, a database write) then serves many keys of a partition
// concurrently. n = 1 is the default, and the same as no option;
// n < 1 or above MaxKeyConcurrency is ErrInvalid. Like every option it
// belongs to the group: joining it with another n is ErrSubscription.
//
// What holds, and what changes:
//
//   - Per-key order holds: a record is delivered only after every earlier
//     record of its partition with an equal encoded key has settled (was
//     acked or dead-lettered), and no two deliveries with equal keys
//     overlap. Keyless records each count as a key of their own: they may
//     run in any order, and at once.
//   - Order across keys inside a partition does not hold: records of
//     different keys are handled concurrently and end in any order.
//     Handle is called from up to n goroutines at once, each delivery on
//     one of them (see Handler).
//   - Commits stay contiguous: the committed offset (Group.Committed, Lag,
//     Drain) moves past an offset only once it and every offset before it
//     have settled, and it reaches the oldest unsettled record. A crash or
//     Close redelivers at most the unsettled records after it, and Close's
//     *ShutdownError reports the partition at that offset. Delivered
//     (GroupStats) counts an acked record once its offset is committed.
//   - A retry holds back only its key: while a failed record waits out its
//     backoff, records of other keys keep flowing, and the records of its
//     key wait behind it. Dead-lettering, ErrPermanent, panics and values
//     that cannot be decoded behave as for one delivery at a time.
//   - The window is bounded: no record more than max(64, 16n) records past
//     the oldest unsettled one is read, so one slow or failing key holds
//     the partition back once the others are that far ahead of it. With
//     WithStuckAfter, a delivery of the oldest unsettled record that runs
//     too long is reported as stuck with its key (StuckEvent's
//     Delivery.Key), which names the key holding the partition.
//   - Pause, Leave and a rebalance wait for every delivery in flight, as
//     they wait for the one delivery otherwise; the records read and not
//     yet settled stay where they are, so the partition's next worker
//     delivers what was not settled and nothing that was (a clean
//     hand-over redelivers nothing). A record waiting out a backoff is
//     retried at once by the next worker, its Attempt counted on. Seek
//     and Replay wait for the deliveries in flight too, then discard the
//     window and start clean from their offset. Close waits for them, and
//     reports the unsettled records when its context ends first.
//   - A Stream may have up to n deliveries of one partition outstanding
//     on its channel; each must be acked or nacked.
//   - Batch consumers are not concurrent this way (a batch already is a
//     unit of concurrency): SubscribeBatch with this option is ErrInvalid.
//   - Snapshot shows each partition's deliveries in flight
//     (GroupPartitionSnapshot.Running) and its oldest unsettled offset;
//     the delivery hooks fire per record as always, and lag is counted
//     from the committed offset.
//
// An engine that cannot run a partition's deliveries concurrently refuses
// n > 1 with ErrInvalid (the in-memory and JetStream engines can).
func WithKeyConcurrency(n int) SubscribeOption {
	return subscribeOptionFunc(func(c *subscribeConfig) {
		switch {
		case n < 1:
			c.invalid(fmt.Errorf("%w: WithKeyConcurrency(%d): at least 1 delivery at a time", ErrInvalid, n))
		case n > MaxKeyConcurrency:
			c.invalid(fmt.Errorf("%w: WithKeyConcurrency(%d): over the limit of %d (MaxKeyConcurrency)", ErrInvalid, n, MaxKeyConcurrency))
		default:
			c.KeyConcurrency = n
		}
	})
}

// Start says where a group reads from in every partition: [Earliest],
// [Latest], [AtOffset] or [AtTime]. The zero Start is Earliest.
type Start struct{ spec engine.Start }

// Earliest starts at the oldest retained record. It is where a new group
// starts by default.
func Earliest() Start { return Start{} }

// Latest starts at the end of each partition: only records published after
// the group started (or replayed) are delivered.
func Latest() Start { return Start{engine.Start{Kind: engine.StartLatest}} }

// AtOffset starts at offset in every partition, clamped to the records
// retained: below the earliest retained record it starts there, past the
// end at the end. A negative offset is [ErrInvalid].
func AtOffset(offset int64) Start {
	return Start{engine.Start{Kind: engine.StartOffset, Offset: offset}}
}

// AtTime starts, in every partition, at the first retained record whose
// [Message.Created] is at or after t (by the broker's [Clock]), or at the
// end when there is none.
func AtTime(t time.Time) Start { return Start{engine.Start{Kind: engine.StartTime, Time: t}} }

// String describes s: "earliest", "latest", "offset 12", "time 2026-…".
func (s Start) String() string { return s.spec.String() }

// StartAt sets where a group created by this call begins, overriding
// [Earliest]. It is applied when the group is created, before any
// delivery, so no record before that point is ever delivered to it.
func StartAt(s Start) SubscribeOption {
	return subscribeOptionFunc(func(c *subscribeConfig) { c.Start = s.spec })
}

// Subscribe adds consumer to group, creating the group on first use, and
// rebalances: the group's partitions are dealt out again over its
// consumers, moving as few as balance allows. A new group starts at the
// oldest retained record, or where [StartAt] says. Calling it again with
// the same group returns the same *Group.
//
// Subscribe does not block: a partition that moves to the new consumer
// finishes the delivery it has in flight first, and moves then. It fails
// with [ErrSubscription] (a bad name, a nil handler, a consumer already in
// the group, options that differ from the group's), [ErrInvalid] for a
// bad option, or [ErrClosed] once Close began, and then changes nothing.
func (t *Topic[K, V]) Subscribe(group, consumer string, h Handler[V], opts ...SubscribeOption) (*Group[V], error) {
	f, ok := h.(HandlerFunc[V])
	switch {
	case h == nil || ok && f == nil:
		return t.join(group, consumer, nil, nil, nil, opts)
	case ok: // called as it is, not through Handle: a call and a copy of the Message fewer per delivery
		return t.join(group, consumer, f, nil, nil, opts)
	}
	return t.join(group, consumer, h.Handle, nil, nil, opts)
}

// deliverer is what a consumer does with one decoded message: a Handler's
// Handle, or a Stream's hand-over. revoked is closed when the group wants
// the partition back (see engine.Delivery).
type deliverer[V any] func(ctx context.Context, msg Message[V], revoked <-chan struct{}) error

// join subscribes handle (which sees only decoded values) as consumer;
// deliver, when not nil, stands in for handle (a Stream), and onLeave is
// called once the consumer left and its workers exited.
func (t *Topic[K, V]) join(group, consumer string, handle func(context.Context, Message[V]) error, deliver deliverer[V], onLeave func(), opts []SubscribeOption) (*Group[V], error) {
	cfg := applySubscribeOptions(opts)
	var h engine.Handler
	if handle != nil || deliver != nil {
		// One arena per partition: a partition is served by one delivery at
		// a time, so each arena has one user at a time. With key
		// concurrency it is served by several: each key is then copied on
		// its own.
		var keys []keyArena
		if cfg.KeyConcurrency <= 1 {
			keys = make([]keyArena, t.Partitions())
		}
		h = func(ctx context.Context, d *engine.Delivery) error {
			v, err := t.values.Decode(d.Record.Value)
			if err != nil {
				return &engine.DecodeError{Topic: d.Topic, Partition: d.Partition, Offset: d.Record.Offset, Err: err}
			}
			var arena *keyArena
			if keys != nil {
				arena = &keys[d.Partition]
			}
			if deliver != nil {
				return handOver(ctx, func(ctx context.Context, m Message[V]) error { return deliver(ctx, m, d.Revoked) },
					d, v, arena)
			}
			return handOver(ctx, handle, d, v, arena)
		}
	}
	if o := t.b.obs; o != nil && o.delivers && h != nil {
		h = o.wrapDelivery(group, consumer, h)
	}
	return t.subscribe(group, cfg, func(cfg engine.GroupSpec) (engine.Group, error) {
		for _, o := range opts {
			if _, ok := o.(batchOption); ok {
				return nil, fmt.Errorf("%w: WithBatchSize and WithBatchWait are for SubscribeBatch", ErrInvalid)
			}
		}
		return t.b.eng.Subscribe(context.Background(), t.Name(), group, consumer, h, onLeave, cfg)
	}, "subscribe consumer %q to group %q on topic %q", consumer, group, t.Name())
}

// subscribe applies opts to a group spec, joins with join, and returns the
// group's typed handle. Errors are wrapped with the verb format and args
// say.
func (t *Topic[K, V]) subscribe(group string, cfg subscribeConfig, join func(engine.GroupSpec) (engine.Group, error), format string, args ...any) (*Group[V], error) {
	if cfg.err != nil {
		return nil, fail(cfg.err, format, args...)
	}
	if cfg.KeyConcurrency > 1 && !t.b.caps.Has(engine.KeyConcurrency) {
		return nil, fail(fmt.Errorf("%w: WithKeyConcurrency(%d): the engine cannot run one partition's deliveries concurrently",
			ErrInvalid, cfg.KeyConcurrency), format, args...)
	}
	if t.deleted.Load() && t.b.eng.State() == engine.Running { // after Close, the engine's ErrClosed
		return nil, fail(t.errDeleted(), format, args...)
	}
	g, err := join(cfg.GroupSpec)
	if err != nil {
		return nil, fail(err, format, args...)
	}
	t.b.reg.addGroup(t.Name(), g)
	t.mu.Lock()
	defer t.mu.Unlock()
	typed, ok := t.groups[group]
	if !ok {
		typed = &Group[V]{eng: g, values: t.values, obs: t.b.obs, topic: t.Name(), state: t.b.eng.State, caps: t.b.caps}
		t.groups[group] = typed
	}
	return typed, nil
}

// Group is a consumer group on one topic: every group sees every record, and
// inside a group each partition, so each record, goes to exactly one
// consumer. Its offsets live in the broker, not in its goroutines, so
// seeks, replays and rebalances lose nothing. All methods are safe for
// concurrent use.
//
// Leave, Pause, Seek and Replay wait for the deliveries in flight on the
// partitions they concern (a [Stream]'s as Stream says), never longer than
// their ctx: none of them blocks forever. What each leaves done when ctx
// ends first is in its doc. After [Broker.Close] the calls behave as
// [ErrClosed] says; after [Broker.DeleteGroup], as it says.
type Group[V any] struct {
	eng    engine.Group
	values codec.Codec[V]
	obs    *observer // the broker's; nil when nothing observes it
	topic  string
	state  func() engine.State // the broker's lifecycle stage
	caps   engine.Capabilities // the broker's engine's

	mu sync.Mutex
	// streams are the group's Streams that have not left, by consumer
	// name, so that a Stream leaves only as itself: after Leave removed
	// its consumer, Close must not remove another that took the name.
	streams map[string]any
}

// joined records s as the Stream of consumer.
func (g *Group[V]) joined(consumer string, s any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.streams == nil {
		g.streams = make(map[string]any)
	}
	g.streams[consumer] = s
}

// left forgets the Stream of consumer, if it is s (or any, for s nil), and
// reports whether it was.
func (g *Group[V]) left(consumer string, s any) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur, ok := g.streams[consumer]
	if !ok || s != nil && cur != s {
		return false
	}
	delete(g.streams, consumer)
	return true
}

// Name returns the group's name.
func (g *Group[V]) Name() string { return g.eng.Name() }

// Leave removes consumer from the group and rebalances: its partitions
// finish their current delivery, then move to the remaining consumers,
// which resume from the committed offsets. Leave waits for those
// deliveries until ctx ends; then it returns an error wrapping ctx's, and
// the consumer has left all the same: its partitions move when their
// deliveries end. An unknown consumer is [ErrSubscription]; after Close,
// [ErrClosed].
func (g *Group[V]) Leave(ctx context.Context, consumer string) error {
	if ctx == nil {
		return fail(errNilContext, "remove consumer %q from group %q on topic %q", consumer, g.Name(), g.topic)
	}
	g.left(consumer, nil)
	err := fail(g.eng.Leave(ctx, consumer), "remove consumer %q from group %q on topic %q", consumer, g.Name(), g.topic)
	g.obs.operator("consumer left", g.topic, g.Name(), err, slog.String("consumer", consumer))
	return err
}

// Assignment returns each consumer's partitions. A consumer that owns none
// (there are more consumers than partitions) has an empty list.
func (g *Group[V]) Assignment() map[string][]int { return g.eng.Assignment() }

// Pause stops the group's deliveries after the ones in flight; records keep
// arriving in the log and the offsets stay where they are. The group is
// paused at once; Pause then waits for the deliveries in flight until ctx
// ends, and returns an error wrapping ctx's naming those still running
// (they finish and commit in the background). While a paused group has
// lag, [Broker.Drain] returns [ErrStalled].
func (g *Group[V]) Pause(ctx context.Context) error {
	if ctx == nil {
		return fail(errNilContext, "pause group %q on topic %q", g.Name(), g.topic)
	}
	err := fail(g.eng.Pause(ctx), "pause group %q on topic %q", g.Name(), g.topic)
	g.obs.operator("paused", g.topic, g.Name(), err)
	return err
}

// Resume restarts deliveries from the committed offsets. The in-memory
// engine does not wait (ctx bounds engines that must reach a server): a
// partition whose delivery from before the pause is still in flight
// restarts when it ends.
func (g *Group[V]) Resume(ctx context.Context) error {
	if ctx == nil {
		return fail(errNilContext, "resume group %q on topic %q", g.Name(), g.topic)
	}
	err := fail(g.eng.Resume(ctx), "resume group %q on topic %q", g.Name(), g.topic)
	g.obs.operator("resumed", g.topic, g.Name(), err)
	return err
}

// Seek moves the group's offset on one partition. offset must lie between
// the earliest retained record and the end of the partition, inclusive
// ([Topic.Offsets]); anything else is [ErrOffsetOutOfRange], and a
// partition that does not exist [ErrInvalid]. The partition's delivery in
// flight finishes first; Seek waits for it until ctx ends, and then moves
// nothing and returns an error wrapping ctx's. Records from offset on are
// delivered again, each with Attempt starting at 1.
func (g *Group[V]) Seek(ctx context.Context, partition int, offset int64) error {
	if ctx == nil {
		return fail(errNilContext, "seek group %q on topic %q", g.Name(), g.topic)
	}
	err := fail(g.eng.Seek(ctx, partition, offset), "seek group %q on topic %q partition %d to offset %d", g.Name(), g.topic, partition, offset)
	g.obs.operator("seeked", g.topic, g.Name(), err, slog.String(attrPartition, strconv.Itoa(partition)), slog.Int64("offset", offset))
	return err
}

// Replay moves every partition's offset to from (see [Start]), rewinding or
// advancing it, at once: no partition is delivered from its new offset
// before every offset moved. Like [Group.Seek] it waits for the deliveries
// in flight until ctx ends, and then moves nothing. Records are delivered
// again with Attempt starting at 1.
func (g *Group[V]) Replay(ctx context.Context, from Start) error {
	if ctx == nil {
		return fail(errNilContext, "replay group %q on topic %q", g.Name(), g.topic)
	}
	err := fail(g.eng.Replay(ctx, from.spec), "replay group %q on topic %q from %v", g.Name(), g.topic, from)
	g.obs.operator("replayed", g.topic, g.Name(), err, slog.String("from", from.String()))
	return err
}

// Committed returns the next offset the group will read from partition, or
// -1 when there is no such partition.
func (g *Group[V]) Committed(partition int) int64 { return g.eng.Committed(partition) }

// Lag returns how many records the group has yet to commit, over all
// partitions.
func (g *Group[V]) Lag() int64 { return g.eng.Lag() }

// GroupStats counts what a group's deliveries did ([Group.Stats]). The
// counters belong to the group and survive rebalances.
type GroupStats struct {
	Delivered          int64 // messages acked
	Retried            int64 // failed attempts that were retried
	DeadLettered       int64 // messages given up on
	Skipped            int64 // records trimmed by retention before the group read them
	DeadLettersEvicted int64 // dead letters pushed out of the bounded queue
	Redriven           int64 // dead letters Redrive sent back to the group
}

// Stats returns the group's counters.
func (g *Group[V]) Stats() GroupStats { return GroupStats(g.eng.Stats()) }

// DeadLetter is a message the group gave up on ([Group.DeadLetters]).
type DeadLetter[V any] struct {
	Message  Message[V] // Value is the zero V when the record could not be decoded, or was not kept
	Attempts int        // deliveries made, the last included
	Err      error      // the last attempt's error: a *DecodeError, a *PanicError or the handler's
	FailedAt time.Time  // by the broker's Clock
	// Truncated is set when the engine could not store the whole record
	// with the letter and kept it without its value: Message.Value is then
	// the zero V, and ValueSize the encoded value's length in bytes. A
	// record whose key and headers alone passed the engine's limits is
	// kept without those too. The in-memory engine keeps every letter
	// whole; an engine whose server limits message sizes says in its
	// documentation when it cannot. [Group.Redrive] cannot send a truncated
	// letter back: the record itself is still in its partition, at
	// Message.Offset, until retention removes it.
	Truncated bool
	ValueSize int
}

// DeadLetters returns the group's dead letters, oldest first: at most the
// group's dead-letter limit ([WithDeadLetterLimit]).
func (g *Group[V]) DeadLetters() []DeadLetter[V] {
	letters := g.eng.DeadLetters()
	out := make([]DeadLetter[V], len(letters))
	for i := range letters {
		out[i] = g.letter(&letters[i])
	}
	return out
}

// letter is the typed view of an engine's dead letter.
func (g *Group[V]) letter(l *engine.DeadLetter) DeadLetter[V] {
	// The zero V when it cannot be decoded, as documented. Decoded from a
	// copy, so that a codec that hands out the bytes it decodes
	// (codec.RawBytes) gives the caller memory of its own, not the
	// letter's, which the next call decodes again.
	var v V
	if !l.Truncated {
		v, _ = g.values.Decode(bytes.Clone(l.Record.Value))
	}
	out := DeadLetter[V]{Attempts: l.Attempts, Err: publicErr(l.Err), FailedAt: l.FailedAt,
		Truncated: l.Truncated, ValueSize: l.ValueSize}
	// The Message a handler was given, built by the same code.
	d := &engine.Delivery{Topic: l.Topic, Partition: l.Partition, ID: l.ID, Record: l.Record, Attempt: l.Attempts}
	_ = handOver(context.Background(), func(_ context.Context, m Message[V]) error {
		out.Message = m
		return nil
	}, d, v, nil)
	return out
}

// Redrive sends the group's dead letters that match accepts (every one
// when match is nil) back to this group, and to no other: each is taken
// out of [Group.DeadLetters] and delivered again on its partition, as a
// new record would be, with [Message.Attempt] counting from 1 again,
// retried and dead-lettered as before if it fails again. Other groups of
// the topic see nothing (publishing the value again would reach them all).
// It returns how many letters it sent back, counted in
// [GroupStats.Redriven], and logs that at Info. To pick letters by ID:
//
//	n, err := g.Redrive(ctx, func(l pubsub.DeadLetter[Order]) bool { return slices.Contains(ids, l.Message.ID) })
//
// A redriven letter is delivered before the records its partition's
// consumer has not read yet, out of offset order (Message.Offset is its
// original offset); it commits nothing, since the group's offset is
// already past it. [Broker.Drain] waits for it; one that Close leaves
// undelivered is put back in DeadLetters. match is called once per letter,
// under no lock, on the caller's goroutine. The in-memory engine does not
// wait for the deliveries (ctx is for engines that must reach a server).
// It fails with [ErrClosed] once Close began, and with [ErrInvalid] on an
// engine that cannot redrive.
func (g *Group[V]) Redrive(ctx context.Context, match func(DeadLetter[V]) bool) (int, error) {
	if ctx == nil {
		return 0, fail(errNilContext, "redrive group %q on topic %q", g.Name(), g.topic)
	}
	n, err := redrive(ctx, g.caps, g.eng, func(l *engine.DeadLetter) bool { return match(g.letter(l)) }, match == nil)
	err = fail(err, "redrive group %q on topic %q", g.Name(), g.topic)
	g.obs.operator("redrove dead letters", g.topic, g.Name(), err, slog.Int("count", n))
	return n, err
}

// redrive asks g's engine to redrive what match accepts, or everything.
func redrive(ctx context.Context, caps engine.Capabilities, g engine.Group, match func(*engine.DeadLetter) bool, all bool) (int, error) {
	r, ok := ability[engine.Redriver](caps, engine.Redrive, g)
	if !ok {
		return 0, fmt.Errorf("%w: the engine cannot redrive dead letters", ErrInvalid)
	}
	if all {
		match = nil
	}
	return r.Redrive(ctx, match)
}

// DiscardDeadLetters removes the group's dead letters that match accepts
// (every one when match is nil) without delivering them, and returns how
// many it removed. The others stay, in their order. It is how an operator
// drops letters known to be garbage; to try them again, use
// [Group.Redrive].
//
// match is called once per letter, under no lock, on the caller's
// goroutine, on a copy: a letter that a concurrent Redrive or eviction
// took meanwhile is neither removed nor counted. The call does not block
// on deliveries. ctx bounds it: when ctx ends part way, the letters removed
// so far stay removed and are counted, and the error wraps ctx's.
//
// It logs the count at Info, and raises no hook. It fails with [ErrClosed]
// once Close began, and with [ErrInvalid] on an engine that cannot discard
// dead letters.
func (g *Group[V]) DiscardDeadLetters(ctx context.Context, match func(DeadLetter[V]) bool) (int, error) {
	if ctx == nil {
		return 0, fail(errNilContext, "discard dead letters of group %q on topic %q", g.Name(), g.topic)
	}
	n, err := g.discard(ctx, match)
	err = fail(err, "discard dead letters of group %q on topic %q", g.Name(), g.topic)
	g.obs.operator("discarded dead letters", g.topic, g.Name(), err, slog.Int("count", n))
	return n, err
}

func (g *Group[V]) discard(ctx context.Context, match func(DeadLetter[V]) bool) (int, error) {
	if g.state() != engine.Running {
		return 0, ErrClosed
	}
	d, ok := ability[engine.DeadLetterDiscarder](g.caps, engine.DiscardDeadLetters, g.eng)
	if !ok {
		return 0, fmt.Errorf("%w: the engine cannot discard dead letters", ErrInvalid)
	}
	if match == nil {
		return d.DiscardDeadLetters(ctx, nil)
	}
	return d.DiscardDeadLetters(ctx, func(l *engine.DeadLetter) bool { return match(g.letter(l)) })
}

// LatestDeadLetters returns the group's newest n dead letters (fewer when
// it holds fewer), newest first, decoding only those: the way to show the
// tail of a long dead-letter queue. n = 0 returns none; a negative n is
// [ErrInvalid]. [Group.DeadLetters] returns them all, oldest first.
//
// An engine that cannot read its newest letters alone (the in-memory engine
// can) has them taken from all of DeadLetters. A remote engine asks its
// server, bounded by ctx: when it could not read all of them, it returns
// those it read with an error saying why; a short result is never silent.
//
// Like DeadLetters it is a read, and works after Close: the in-memory
// engine still holds its letters then (an engine whose server connection
// closed with the broker says [ErrClosed]). It logs nothing.
func (g *Group[V]) LatestDeadLetters(ctx context.Context, n int) ([]DeadLetter[V], error) {
	const verb = "latest dead letters of group %q on topic %q"
	switch {
	case ctx == nil:
		return nil, fail(errNilContext, verb, g.Name(), g.topic)
	case n < 0:
		return nil, fail(fmt.Errorf("%w: %d letters asked for", ErrInvalid, n), verb, g.Name(), g.topic)
	}
	r, ok := g.eng.(engine.DeadLetterReader)
	if !ok {
		letters := g.eng.DeadLetters()
		out := make([]DeadLetter[V], min(n, len(letters)))
		for i := range out {
			out[i] = g.letter(&letters[len(letters)-1-i])
		}
		return out, nil
	}
	letters, err := r.LatestDeadLetters(ctx, n)
	out := make([]DeadLetter[V], len(letters))
	for i := range letters {
		out[i] = g.letter(&letters[i])
	}
	return out, fail(err, verb, g.Name(), g.topic)
}

// keyArena copies delivered messages' keys, many short keys per
// allocation: each copy is a slice of its own whose capacity ends where it
// does, so writing to it or appending to it leaves the others alone. Not
// safe for concurrent use.
type keyArena struct {
	free []byte
	_    [40]byte // a cache line each: the arenas of a topic's partitions are used by different workers
}

const keyArenaSize = 1024

// clone returns a copy of key (nil for nil). A nil arena allocates each
// copy on its own.
func (a *keyArena) clone(key []byte) []byte {
	if a == nil || len(key) == 0 || len(key) > keyArenaSize/16 {
		return bytes.Clone(key) // nil stays nil, empty stays empty and non-nil
	}
	if cap(a.free)-len(a.free) < len(key) {
		a.free = make([]byte, 0, keyArenaSize)
	}
	start := len(a.free)
	a.free = append(a.free, key...)
	return a.free[start:len(a.free):len(a.free)]
}
