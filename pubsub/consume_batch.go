package pubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/logbus/logbus/engine"
)

// BatchHandler processes the messages of one consumer in batches: each
// call gets consecutive messages of one partition, in offset order, as
// many as were published since the last call, up to the consumer's batch
// size ([WithBatchSize]), after waiting at most [WithBatchWait] for more.
// It pays the per-message costs of a delivery (a call, a commit, the
// bookkeeping) once per batch, as a Kafka consumer polls and commits.
//
// Returning nil acks every message of the batch: the group commits the
// offset after the last one, once. Returning a [*BatchError] acks a prefix
// of the batch and fails one message. Any other error, or a panic, fails
// the first message, and so redelivers the whole batch. A failed message
// is retried alone, and then dead-lettered, as with a [Handler]; the
// messages after it wait meanwhile, so per-key order holds, and every
// message of a batch has the same Attempt. A message whose value cannot be
// decoded is dead-lettered at once: the handler gets the messages before
// it, then those after it in the next batch.
//
// HandleBatch runs on the worker goroutine of its partition, as Handle
// does. msgs is valid only during the call: its backing array is reused
// for the partition's next batch, so keep the Messages (copies), not the
// slice. Values are the handler's own, except with [codec.RawBytes]. ctx,
// and the calls a handler must not make on its own group without a
// deadline, are as for Handler: a batch in flight is a delivery in flight.
type BatchHandler[V any] interface {
	HandleBatch(ctx context.Context, msgs []Message[V]) error
}

// BatchHandlerFunc adapts a function to a [BatchHandler].
type BatchHandlerFunc[V any] func(ctx context.Context, msgs []Message[V]) error

// HandleBatch calls f(ctx, msgs).
func (f BatchHandlerFunc[V]) HandleBatch(ctx context.Context, msgs []Message[V]) error {
	return f(ctx, msgs)
}

// BatchError is what a [BatchHandler] returns when one message of its batch
// failed: the messages before Index succeeded and are committed, the one
// at Index failed with Err (retried, or dead-lettered with Err), and the
// ones after it were not processed and come again in a later batch. An
// Index outside the batch fails the first message with an error wrapping
// [ErrInvalid]. A handler may wrap a BatchError; the outermost one counts.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("logbus: batch message %d failed: %v", e.Index, e.Err)
}

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// errBatchNil stands in for a [BatchError] without an Err.
var errBatchNil = errors.New("logbus: batch handler failed the message")

// batchOption is a [SubscribeOption] only SubscribeBatch takes.
type batchOption func(*subscribeConfig)

func (f batchOption) applySubscribe(c *subscribeConfig) { f(c) }

// MaxBatchSize is the most messages a batch consumer may take in one call
// ([WithBatchSize]).
const MaxBatchSize = 1 << 12 // 4096

// WithBatchSize sets the most messages a batch consumer gets in one call,
// overriding the default of 64: 1 to [MaxBatchSize]; anything else, 0
// included, is [ErrInvalid]. It is the consumer's own, not the group's:
// consumers of one group may differ. Only [Topic.SubscribeBatch] takes it.
//
// Memory follows what the consumer reads, not n: for each partition it
// serves, the consumer keeps room for the largest batch it has delivered
// there (about 160 bytes a message, plus what the messages' values hold),
// which a partition that never has more than a few records waiting keeps
// small whatever n is. n bounds it.
func WithBatchSize(n int) SubscribeOption {
	return batchOption(func(c *subscribeConfig) {
		c.batch.MaxSize, c.batchSize = n, true
	})
}

// WithBatchWait sets how long a batch consumer that found fewer messages
// than its batch size waits for more before it takes what it has: a
// larger batch for up to d more latency. The default, 0, takes them at
// once; negative is [ErrInvalid]. The wait ends early when the batch fills,
// and when the partition is revoked (the messages are then delivered later,
// to whoever owns it). [Broker.Drain] and [Broker.Close] wait for it like
// for a delivery. Only [Topic.SubscribeBatch] takes it.
func WithBatchWait(d time.Duration) SubscribeOption {
	return batchOption(func(c *subscribeConfig) { c.batch.MaxWait = d })
}

// SubscribeBatch adds consumer to group like [Topic.Subscribe], with a
// handler that takes batches ([BatchHandler]); it takes the options
// Subscribe takes, and [WithBatchSize] and [WithBatchWait]. A group may
// have both kinds of consumers: each partition is delivered by its owner's
// kind.
//
// It fails as Subscribe does, and with [ErrInvalid] when the broker's
// engine cannot deliver batches (the in-memory engine can). It does not
// block.
func (t *Topic[K, V]) SubscribeBatch(group, consumer string, h BatchHandler[V], opts ...SubscribeOption) (*Group[V], error) {
	cfg := applySubscribeOptions(opts)
	if cfg.batchSize && cfg.batch.MaxSize < 1 {
		cfg.invalid(fmt.Errorf("%w: WithBatchSize(%d): a batch holds at least one message", ErrInvalid, cfg.batch.MaxSize))
	}
	if cfg.KeyConcurrency > 1 {
		cfg.invalid(fmt.Errorf("%w: WithKeyConcurrency(%d) is not for SubscribeBatch: a batch is already a unit of concurrency",
			ErrInvalid, cfg.KeyConcurrency))
	}
	bs, ok := ability[engine.BatchSubscriber](t.b.caps, engine.Batches, t.b.eng)
	if !ok {
		return nil, fail(fmt.Errorf("%w: the engine cannot deliver batches", ErrInvalid), "subscribe consumer %q to group %q on topic %q", consumer, group, t.Name())
	}
	var handle func(context.Context, []Message[V]) error
	switch f, isFunc := h.(BatchHandlerFunc[V]); {
	case h == nil || isFunc && f == nil:
	case isFunc:
		handle = f
	default:
		handle = h.HandleBatch
	}
	var eh engine.BatchHandler
	if handle != nil {
		// One buffer and one key arena per partition, each used by one
		// delivery at a time.
		parts := make([]batchBuffer[V], t.Partitions())
		eh = func(ctx context.Context, b *engine.Batch) error {
			return t.handOverBatch(ctx, handle, b, &parts[b.Partition])
		}
	}
	if o := t.b.obs; o != nil && o.delivers && eh != nil {
		eh = o.wrapBatch(group, consumer, eh)
	}
	return t.subscribe(group, cfg, func(spec engine.GroupSpec) (engine.Group, error) {
		return bs.SubscribeBatch(context.Background(), t.Name(), group, consumer, eh, nil, spec, cfg.batch)
	}, "subscribe consumer %q to group %q on topic %q", consumer, group, t.Name())
}

// batchBuffer is a partition's reused Messages and keys.
type batchBuffer[V any] struct {
	msgs []Message[V]
	keys keyArena
}

// handOverBatch decodes b into Messages and calls handle with them, up to
// the first record that cannot be decoded; it returns the engine's form of
// the outcome (see [engine.BatchHandler]).
func (t *Topic[K, V]) handOverBatch(ctx context.Context, handle func(context.Context, []Message[V]) error, b *engine.Batch, buf *batchBuffer[V]) error {
	msgs := buf.msgs[:0]
	var bad error // the first record that cannot be decoded ends the batch there
	for i, rec := range b.Records {
		v, err := t.values.Decode(rec.Value)
		if err != nil {
			bad = &engine.DecodeError{Topic: b.Topic, Partition: b.Partition, Offset: rec.Offset, Err: err}
			break
		}
		msgs = append(msgs, Message[V]{
			ID:        b.IDs[i],
			Topic:     b.Topic,
			Partition: b.Partition,
			Offset:    rec.Offset,
			Key:       buf.keys.clone(rec.Key), // the record is shared by every group
			Value:     v,
			Headers:   maps.Clone(rec.Headers),
			Created:   rec.Created,
			Attempt:   b.Attempt,
		})
	}
	n := len(msgs)
	var err error
	if n > 0 {
		err = handle(ctx, msgs)
		clear(msgs) // let go of values (RawBytes: the log's memory) and keys
	}
	buf.msgs = msgs[:0]
	switch {
	case err != nil:
		be, ok := errors.AsType[*BatchError](err)
		switch {
		case !ok:
			return err
		case be.Index < 0 || be.Index >= n:
			return fmt.Errorf("%w: a batch of %d messages failed at index %d: %w", ErrInvalid, n, be.Index, err)
		case be.Err == nil:
			return &engine.BatchError{Index: be.Index, Err: errBatchNil}
		}
		return &engine.BatchError{Index: be.Index, Err: be.Err}
	case bad != nil:
		return &engine.BatchError{Index: n, Err: bad}
	}
	return nil
}
