package pubsub

import (
	"context"
	"errors"
	"iter"
	"sync"

	"github.com/logbus/logbus/internal/core"
)

// Stream is a consumer whose messages arrive on a channel instead of through
// a Handler. It is a member of its group like any other consumer: it owns
// some of the group's partitions, and each of them delivers one message at a
// time.
//
// Every Delivery must be acked or nacked. Until then its partition delivers
// nothing further (per-key order) and its offset is not committed
// (at-least-once). Deliveries of different partitions can be outstanding at
// once.
//
// Leave the group with Stream.Close, not Group.Leave: Close gives the
// outstanding deliveries back at once, while Leave waits for them to be
// settled, which never happens if the goroutine that would settle them is
// the one calling Leave.
type Stream[V any] struct {
	group    *Group[V]
	consumer string
	ch       chan *Delivery[V]
	done     chan struct{} // closed by Close: outstanding deliveries are given back

	closeOnce sync.Once
	closeErr  error
	chOnce    sync.Once
}

// Delivery is one message handed to a Stream. Ack or Nack it exactly once;
// later calls do nothing.
type Delivery[V any] struct {
	Message[V]
	outcome chan error // buffered: settling never blocks
	once    sync.Once
}

// Ack reports the message processed: its offset is committed and the next
// message of its partition follows. It does not block.
func (d *Delivery[V]) Ack() { d.once.Do(func() { d.outcome <- nil }) }

// errNacked stands in for a nil error given to Nack.
var errNacked = errors.New("logbus: nacked")

// Nack reports the message failed with err: it counts as a failed attempt,
// so the message is retried with backoff and then dead-lettered; an err
// wrapping ErrPermanent dead-letters it at once. It does not block.
func (d *Delivery[V]) Nack(err error) {
	if err == nil {
		err = errNacked
	}
	d.once.Do(func() { d.outcome <- err })
}

// Stream joins group as consumer, like Subscribe, and returns the consumer's
// channel of deliveries. It fails as Subscribe does.
func (t *Topic[K, V]) Stream(group, consumer string, opts ...SubscribeOption) (*Stream[V], error) {
	s := &Stream[V]{consumer: consumer, ch: make(chan *Delivery[V]), done: make(chan struct{})}
	// The outcome channel of each partition's last settled delivery, for
	// its next delivery: once the outcome is received, the delivery's once
	// has fired, so nothing sends on the channel again. A partition is
	// served by one worker at a time, so each slot has one user at a time.
	outcomes := make([]chan error, t.Partitions())
	handle := func(ctx context.Context, msg Message[V]) error {
		outcome := outcomes[msg.Partition]
		outcomes[msg.Partition] = nil
		if outcome == nil {
			outcome = make(chan error, 1) // buffered: settling never blocks
		}
		d := &Delivery[V]{Message: msg, outcome: outcome}
		select {
		case s.ch <- d:
		case <-s.done:
			return core.ErrNotDelivered
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err := <-d.outcome:
			outcomes[msg.Partition] = outcome
			return err
		case <-s.done:
			return core.ErrAbandoned
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	closeCh := func() { s.chOnce.Do(func() { close(s.ch) }) }
	g, err := t.join(group, consumer, handle, closeCh, opts)
	if err != nil {
		return nil, err
	}
	s.group = g
	return s, nil
}

// C returns the channel of deliveries. It is closed when the stream leaves
// its group: by Close, or by Broker.Close.
func (s *Stream[V]) C() <-chan *Delivery[V] { return s.ch }

// All returns an iterator over the deliveries, for use with range; it ends
// when C is closed. Each delivery must still be acked or nacked.
func (s *Stream[V]) All() iter.Seq[*Delivery[V]] {
	return func(yield func(*Delivery[V]) bool) {
		for d := range s.ch {
			if !yield(d) {
				return
			}
		}
	}
}

// Group returns the stream's group.
func (s *Stream[V]) Group() *Group[V] { return s.group }

// Close leaves the group. Deliveries not yet acked or nacked are given back
// without counting as failures and go, with the stream's partitions, to the
// group's remaining consumers (or to the next one to join). C is closed when
// Close returns. Close is idempotent; after Broker.Close it does nothing.
func (s *Stream[V]) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		if err := s.group.Leave(s.consumer); err != nil && !errors.Is(err, ErrClosed) {
			s.closeErr = err
		}
	})
	return s.closeErr
}
