package kit

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/logbus/logbus/engine"
)

// Call runs h on d (an engine.Handler on a *Delivery, or an
// engine.BatchHandler on a *Batch) and returns its error; a panic in h
// becomes a *engine.PanicError with the panicking goroutine's stack,
// which the engine counts as a failed attempt. It allocates nothing
// unless h panics.
func Call[D any](ctx context.Context, h func(context.Context, D) error, d D) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &engine.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, d)
}

// Outcome reads a batch handler's error for a batch of n records: how
// many records from the first succeeded (done), and the error of the one
// after them (nil when all did), as engine.BatchHandler says. A
// *engine.BatchError whose Index is outside the batch is the handler's
// mistake: the first record fails with an error wrapping ErrInvalid that
// says so. Only an error that is itself a *BatchError names a record: one
// wrapped in another error fails the first record.
func Outcome(err error, n int) (done int, failed error) {
	if err == nil {
		return n, nil
	}
	be, ok := err.(*engine.BatchError)
	switch {
	case !ok:
		return 0, err
	case be.Index < 0 || be.Index >= n:
		return 0, fmt.Errorf("%w: a batch of %d records failed at index %d: %w", engine.ErrInvalid, n, be.Index, be)
	case be.Err == nil:
		return be.Index, be
	}
	return be.Index, be.Err
}

// Verdict is what becomes of a record after an attempt on it.
type Verdict uint8

const (
	// Ack: the handler returned nil. Commit the record.
	Ack Verdict = iota
	// NotDelivered: given back before it reached the consumer
	// (ErrNotDelivered). No commit, and the attempt never happened: the
	// next delivery carries the same attempt number.
	NotDelivered
	// Abandoned: the consumer took it and gave it back without an outcome
	// (ErrAbandoned). No commit; it comes again, the attempt counted.
	Abandoned
	// Retry: the attempt failed and the policy allows another. Wait out
	// the backoff, then deliver it again.
	Retry
	// DeadLetter: failed for good, because the error wraps ErrPermanent or
	// the attempt was the last the policy allows. Dead-letter it, then
	// commit it.
	DeadLetter
)

// Judge says what becomes of a record whose attempt (1 for the first)
// ended with err, under a retry policy of maxAttempts. It is the one place
// the engines read a handler's error; the success path costs a nil check.
func Judge(err error, attempt, maxAttempts int) Verdict {
	if err == nil {
		return Ack
	}
	return judgeFailure(err, attempt, maxAttempts)
}

func judgeFailure(err error, attempt, maxAttempts int) Verdict {
	switch {
	case errors.Is(err, engine.ErrNotDelivered):
		return NotDelivered
	case errors.Is(err, engine.ErrAbandoned):
		return Abandoned
	case errors.Is(err, engine.ErrPermanent) || attempt >= maxAttempts:
		return DeadLetter
	}
	return Retry
}
