package pubsubtest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/logbus/logbus/pubsub"
)

var _ pubsub.Handler[int] = (*Recorder[int])(nil)

// Recorder is a [pubsub.Handler] that acks every message and remembers it,
// in ack order, so a test can check what its code published. FailWith makes
// it fail chosen messages instead, to exercise retries and dead letters.
//
// A Recorder is safe for concurrent use: the broker calls Handle from one
// goroutine per partition at once, while the test reads it. Only WaitFor
// blocks for long; it waits on a channel, so it also works inside a
// testing/synctest bubble. The zero Recorder is ready to use; a Recorder
// must not be copied after first use. Once WaitFor has been called inside a
// bubble, the Recorder belongs to that bubble: use a fresh one per bubble.
//
// A Recorder keeps the messages it is given, so the topic it records must
// decode into values of their own: codec.Bytes, not codec.RawBytes, whose
// values are valid only while the handler runs.
type Recorder[V any] struct {
	mu    sync.Mutex
	fail  func(pubsub.Message[V]) error
	acked []pubsub.Message[V]
	calls int
	// acks is closed and replaced on every ack, so that every WaitFor
	// waiting on it wakes and counts again. Made lazily so the zero
	// Recorder works.
	acks chan struct{}
}

// NewRecorder returns an empty Recorder. It does not block.
func NewRecorder[V any]() *Recorder[V] {
	return &Recorder[V]{}
}

// FailWith makes Handle call fail for every message first: when fail
// returns an error, Handle returns it (the broker retries the message, or
// dead-letters it if the error wraps [pubsub.ErrPermanent]) and the message
// is not recorded. fail nil makes Handle ack everything again.
//
// It is safe for concurrent use and takes effect from the next Handle call;
// a call in progress keeps the function it started with. fail is called
// from the broker's worker goroutines, one per partition at once, so it
// must be safe for concurrent use itself. FailWith does not block beyond a
// short critical section.
func (r *Recorder[V]) FailWith(fail func(pubsub.Message[V]) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = fail
}

// Handle counts the call, then acks msg and records it unless the function
// given to FailWith returns an error for it, which Handle returns. It
// never blocks on the broker or on ctx, and is safe for concurrent use.
func (r *Recorder[V]) Handle(_ context.Context, msg pubsub.Message[V]) error {
	r.mu.Lock()
	r.calls++
	fail := r.fail
	r.mu.Unlock()
	// The failure function is user code: run it under none of our locks,
	// so it may read the Recorder.
	if fail != nil {
		if err := fail(msg); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked = append(r.acked, msg)
	if r.acks != nil {
		close(r.acks)
		r.acks = nil // the next waiter makes a fresh one
	}
	return nil
}

// Messages returns the acked messages in the order Handle acked them: within
// a partition, offset order, except that a message delivered again (after a
// replay or a seek) is recorded again; a clean rebalance redelivers
// nothing. The slice is the
// caller's, but the messages' Key, Headers and Value are shared with the
// Recorder and must be treated as read-only. It is safe for concurrent use
// and does not block beyond a short critical section.
func (r *Recorder[V]) Messages() []pubsub.Message[V] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.acked)
}

// Values returns the values of the acked messages in ack order, as
// Messages does. It is safe for concurrent use and does not block beyond a
// short critical section.
func (r *Recorder[V]) Values() []V {
	r.mu.Lock()
	defer r.mu.Unlock()
	vs := make([]V, len(r.acked))
	for i, m := range r.acked {
		vs[i] = m.Value
	}
	return vs
}

// Len returns how many messages were acked. It is safe for concurrent use
// and does not block beyond a short critical section.
func (r *Recorder[V]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// Calls returns how many times Handle was called, failed calls included,
// so Calls() - Len() is the number of failed attempts. It is safe for
// concurrent use and does not block beyond a short critical section.
func (r *Recorder[V]) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// WaitFor blocks until at least n messages have been acked and returns nil,
// or until ctx ends first and returns ctx's error, wrapped with the count
// reached. It is woken by every ack and never polls, so it is the barrier a
// test waits on instead of sleeping; inside a testing/synctest bubble its
// wait is durable, and a ctx timeout expires in virtual time.
//
// It is safe for concurrent use: any number of goroutines may wait at once.
func (r *Recorder[V]) WaitFor(ctx context.Context, n int) error {
	for {
		r.mu.Lock()
		have := len(r.acked)
		if have >= n {
			r.mu.Unlock()
			return nil
		}
		if r.acks == nil {
			r.acks = make(chan struct{})
		}
		acks := r.acks
		r.mu.Unlock()
		select {
		case <-acks:
		case <-ctx.Done():
			// An ack and the end of ctx can be ready together; the count,
			// not select's random choice, decides.
			if have = r.Len(); have >= n {
				return nil
			}
			return fmt.Errorf("pubsubtest: waiting for %d acked messages, have %d: %w", n, have, ctx.Err())
		}
	}
}
