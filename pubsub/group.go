package pubsub

import (
	"bytes"
	"context"
	"maps"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/internal/core"
)

// Handler processes the messages of one consumer. Returning nil acks the
// message: its offset is committed and the next message of the partition
// follows. Returning an error, or panicking, nacks it: the message is
// retried with backoff and then dead-lettered (see RetryPolicy), and an error
// wrapping ErrPermanent skips the retries.
//
// Handle runs on the worker goroutine of the message's partition, so calls
// for one partition never overlap and come in offset order; calls for
// different partitions run concurrently. Delivery is at least once: a
// message can come again after a failure, a rebalance or a shutdown that
// interrupted it, so a handler must be idempotent (Message.ID is a stable
// key for that).
//
// ctx is cancelled only when Broker.Close gives up on draining; a handler
// must return soon after. A handler must not call Close, Leave, Pause, Seek
// or Replay on its own group, or Subscribe to it: those wait for the
// handler to return.
type Handler[V any] interface {
	Handle(ctx context.Context, msg Message[V]) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc[V any] func(ctx context.Context, msg Message[V]) error

// Handle calls f(ctx, msg).
func (f HandlerFunc[V]) Handle(ctx context.Context, msg Message[V]) error { return f(ctx, msg) }

// Message is one record as a consumer sees it. Key and Headers are the
// consumer's own copies: changing them changes nothing for anyone else. A
// short Key shares one allocation with the keys of other messages of its
// partition (as Message.ID shares one with other IDs), so keeping a Key
// keeps up to 1 KiB alive; copy it to keep many. Value is the consumer's
// own too, except with codec.RawBytes, where it is the log's memory and
// valid only until the handler returns (see there).
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

// handOver calls handle with the Message of rec, whose value is value.
// keys, when not nil, is where its key is copied to. The Message is built
// in the call's arguments rather than returned by a constructor: it is 136
// bytes, and a constructor costs a copy of it per delivery.
func handOver[V any](ctx context.Context, handle func(context.Context, Message[V]) error, rec *core.Record, value V, attempt int, keys *keyArena) error {
	return handle(ctx, Message[V]{
		ID:        rec.ID(),
		Topic:     rec.Topic(),
		Partition: rec.Partition(),
		Offset:    rec.Offset,
		Key:       keys.clone(rec.Key), // the record is shared by every group
		Value:     value,
		Headers:   maps.Clone(rec.Headers),
		Created:   rec.Created,
		Attempt:   attempt,
	})
}

// SubscribeOption configures the group that Subscribe or Stream creates.
// Options given when the group already exists are ignored: a group's
// configuration is fixed by the call that created it.
type SubscribeOption interface{ applySubscribe(*core.GroupConfig) }

type subscribeOptionFunc func(*core.GroupConfig)

func (f subscribeOptionFunc) applySubscribe(c *core.GroupConfig) { f(c) }

// WithGroupRetry sets this group's retry policy, overriding the broker's
// (WithRetry).
func WithGroupRetry(p RetryPolicy) SubscribeOption {
	return subscribeOptionFunc(func(c *core.GroupConfig) { c.Retry = p.core() })
}

// WithDeadLetterLimit sets how many dead letters the group keeps, overriding
// the default of 1024. When full, the oldest is evicted and counted in
// GroupStats.DeadLettersEvicted. Negative is ErrInvalid.
func WithDeadLetterLimit(n int) SubscribeOption {
	return subscribeOptionFunc(func(c *core.GroupConfig) { c.DeadLetterLimit = n })
}

// Subscribe adds consumer to group, creating the group on first use, and
// rebalances: the group's partitions are dealt out again over its consumers,
// moving as few as balance allows. A new group starts at the oldest retained
// record. Calling it again with the same group returns the same *Group.
//
// Subscribe waits for the deliveries in flight on the partitions that move
// to finish, so it must not be called from a handler of the same group.
// It fails with ErrSubscription for an empty group or consumer name, a nil
// handler or a consumer already in the group; with ErrInvalid for a bad
// option; with ErrClosed once Close began. A failed Subscribe changes
// nothing.
func (t *Topic[K, V]) Subscribe(group, consumer string, h Handler[V], opts ...SubscribeOption) (*Group[V], error) {
	f, ok := h.(HandlerFunc[V])
	switch {
	case h == nil || ok && f == nil:
		return t.join(group, consumer, nil, nil, opts)
	case ok: // called as it is, not through Handle: a call and a copy of the Message fewer per delivery
		return t.join(group, consumer, f, nil, opts)
	}
	return t.join(group, consumer, h.Handle, nil, opts)
}

// join subscribes handle (which sees only decoded values) as consumer.
func (t *Topic[K, V]) join(group, consumer string, handle func(context.Context, Message[V]) error, onLeave func(), opts []SubscribeOption) (*Group[V], error) {
	var cfg core.GroupConfig
	for _, o := range opts {
		o.applySubscribe(&cfg)
	}
	var h core.Handler
	if handle != nil {
		// One arena per partition: a partition is served by one worker at a
		// time, and a worker stops before the next one starts, so each
		// arena has one user at a time.
		keys := make([]keyArena, t.Partitions())
		h = func(ctx context.Context, rec *core.Record, attempt int) error {
			v, err := t.values.Decode(rec.Value)
			if err != nil {
				return &DecodeError{Topic: rec.Topic(), Partition: rec.Partition(), Offset: rec.Offset, Err: err}
			}
			return handOver(ctx, handle, rec, v, attempt, &keys[rec.Partition()])
		}
	}
	g, err := t.b.eng.Subscribe(t.Name(), group, consumer, h, onLeave, cfg)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	typed, ok := t.groups[group]
	if !ok {
		typed = &Group[V]{eng: g, values: t.values}
		t.groups[group] = typed
	}
	return typed, nil
}

// Group is a consumer group on one topic: every group sees every record, and
// inside a group each partition, so each record, goes to exactly one
// consumer. Its offsets live in the broker, not in its goroutines, so
// seeks, replays and rebalances lose nothing. All methods are safe for
// concurrent use; the ones that start or stop workers (Leave, Pause, Resume,
// Seek, Replay) wait for the deliveries they interrupt and must not be
// called from the group's own handlers. After Broker.Close, Leave, Seek and
// Replay fail with ErrClosed, Pause and Resume do nothing, and the methods
// that only read (Assignment, Committed, Lag, Stats, DeadLetters) keep
// working.
type Group[V any] struct {
	eng    engineGroup
	values codec.Codec[V]
}

// Name returns the group's name.
func (g *Group[V]) Name() string { return g.eng.Name() }

// Leave removes consumer from the group and rebalances: its partitions
// finish their current delivery, then move to the remaining consumers, which
// resume from the committed offsets. An unknown consumer is ErrSubscription;
// after Close, ErrClosed.
func (g *Group[V]) Leave(consumer string) error { return g.eng.Leave(consumer) }

// Assignment returns each consumer's partitions. A consumer that owns none
// (there are more consumers than partitions) has an empty list.
func (g *Group[V]) Assignment() map[string][]int { return g.eng.Assignment() }

// Pause stops the group's deliveries after the ones in flight; records keep
// arriving in the log and the offsets stay where they are. Drain does not
// wait for a paused group. It blocks until the deliveries in flight finish.
func (g *Group[V]) Pause() { g.eng.Pause() }

// Resume restarts deliveries from the committed offsets.
func (g *Group[V]) Resume() { g.eng.Resume() }

// Seek moves the group's offset on one partition. offset must lie between
// the earliest retained record and the end of the partition, inclusive;
// anything else is ErrOffsetOutOfRange, and a partition that does not exist
// ErrInvalid. The partition's worker finishes its current delivery first.
// Records from offset on are delivered again, each with Attempt starting
// at 1.
func (g *Group[V]) Seek(partition int, offset int64) error { return g.eng.Seek(partition, offset) }

// Replay rewinds every partition to max(from, earliest retained offset), or
// to its end where from is past it. Negative from is ErrInvalid.
func (g *Group[V]) Replay(from int64) error { return g.eng.Replay(from) }

// Committed returns the next offset the group will read from partition, or
// -1 when there is no such partition.
func (g *Group[V]) Committed(partition int) int64 { return g.eng.Committed(partition) }

// Lag returns how many records the group has yet to commit, over all
// partitions.
func (g *Group[V]) Lag() int64 { return g.eng.Lag() }

// GroupStats counts what a group's deliveries did. The counters belong to the
// group and survive rebalances.
type GroupStats struct {
	Delivered          int64 // messages acked
	Retried            int64 // failed attempts that were retried
	DeadLettered       int64 // messages given up on
	Skipped            int64 // records trimmed by retention before the group read them
	DeadLettersEvicted int64 // dead letters pushed out of the bounded queue
}

// Stats returns the group's counters.
func (g *Group[V]) Stats() GroupStats { return GroupStats(g.eng.Stats()) }

// DeadLetter is a message the group gave up on.
type DeadLetter[V any] struct {
	Message  Message[V] // Value is the zero V when the record could not be decoded
	Attempts int        // deliveries made, the last included
	Err      error      // the last attempt's error: a *DecodeError, a *PanicError or the handler's
	FailedAt time.Time  // by the broker's Clock
}

// DeadLetters returns the group's dead letters, oldest first: at most the
// group's dead-letter limit (WithDeadLetterLimit).
func (g *Group[V]) DeadLetters() []DeadLetter[V] {
	letters := g.eng.DeadLetters()
	out := make([]DeadLetter[V], len(letters))
	for i, l := range letters {
		// The zero V when it cannot be decoded, as documented. Decoded from a
		// copy, so that a codec that hands out the bytes it decodes
		// (codec.RawBytes) gives the caller memory of its own, not the
		// letter's, which the next call decodes again.
		v, _ := g.values.Decode(bytes.Clone(l.Record.Value))
		out[i] = DeadLetter[V]{Attempts: l.Attempts, Err: l.Err, FailedAt: l.FailedAt}
		// The Message a handler was given, built by the same code.
		_ = handOver(context.Background(), func(_ context.Context, m Message[V]) error {
			out[i].Message = m
			return nil
		}, l.Record, v, l.Attempts, nil)
	}
	return out
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
