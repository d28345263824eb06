package engine

import (
	"context"
	"fmt"
	"time"
)

// BatchSubscriber is implemented by an engine that can hand a consumer the
// records of a partition in batches (the Batches capability). It is
// optional: an engine without it still implements Engine, and the typed
// layer refuses a batch consumer on it with [ErrInvalid].
type BatchSubscriber interface {
	// SubscribeBatch is Subscribe for a consumer whose handler takes
	// batches. A group may mix batch and per-record consumers: each
	// partition is served by its owner's kind of handler.
	SubscribeBatch(ctx context.Context, topic, group, consumer string, h BatchHandler, onLeave func(), spec GroupSpec, batch BatchSpec) (Group, error)
}

// Batch is one attempt to deliver consecutive records of one partition, in
// offset order, to a consumer. The engine fills it and hands it to the
// consumer's [BatchHandler]; it, its slices and the Records they point to are
// valid until the handler returns.
type Batch struct {
	Topic     string
	Partition int
	Records   []*Record // at least one; consecutive offsets
	IDs       []string  // IDs[i] is the ID of Records[i], as Delivery.ID
	// Attempt is the attempt of every record of the batch: a record that
	// failed is retried alone, so a batch of more than one record is
	// always a first attempt (1).
	Attempt int
	// Revoked is closed when the group wants the partition back, as
	// [Delivery.Revoked].
	Revoked <-chan struct{}
}

// BatchHandler processes one batch. nil acks every record. A [*BatchError]
// acks the records before its Index and fails the one at it with its Err;
// the records after it are delivered again once it is settled. Any other
// error, or a panic, fails the first record (and so the whole batch is
// delivered again from there). The failed record goes through the retry,
// backoff and dead-letter path of a per-record delivery, alone: the
// records after it wait, so per-key order holds. Calls for one partition
// never overlap. ctx ends only when Close gives up on draining.
type BatchHandler func(ctx context.Context, b *Batch) error

// BatchError is a batch handler's error that names the record that failed:
// the records before Index succeeded, the one at Index failed with Err, and
// the ones after it were not processed.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("batch record %d: %v", e.Index, e.Err)
}

// Unwrap returns Err, so errors.Is sees [ErrPermanent] through a [BatchError].
func (e *BatchError) Unwrap() error { return e.Err }

// BatchSpec is how a batch consumer takes its batches. Zero fields mean the
// defaults.
type BatchSpec struct {
	// MaxSize is the most records in one batch; default 64, at most
	// [MaxBatchSize].
	MaxSize int
	// MaxWait is how long a consumer that found fewer than MaxSize records
	// waits for more before it takes what it has; 0 takes them at once.
	MaxWait time.Duration
}

// Limits and defaults of [BatchSpec].
const (
	DefaultBatchSize = 64
	// MaxBatchSize bounds MaxSize: a worker keeps a slot per record of
	// the largest batch it has delivered, and the typed layer a Message
	// per record for each partition (about 160 bytes a record in all: 640
	// KiB per partition at this bound, for a partition that has had that
	// many records to deliver at once). Kafka's max.poll.records is 500 by
	// default.
	MaxBatchSize = 1 << 12
)

// Resolve checks s and fills its zero fields with the defaults.
func (s BatchSpec) Resolve() (BatchSpec, error) {
	switch {
	case s.MaxSize < 0 || s.MaxSize > MaxBatchSize:
		return s, fmt.Errorf("%w: batch size %d, want 1 to %d (MaxBatchSize)", ErrInvalid, s.MaxSize, MaxBatchSize)
	case s.MaxWait < 0:
		return s, fmt.Errorf("%w: batch wait %v is negative", ErrInvalid, s.MaxWait)
	}
	if s.MaxSize == 0 {
		s.MaxSize = DefaultBatchSize
	}
	return s, nil
}
