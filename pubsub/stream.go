package pubsub

import (
	"context"
	"errors"
	"iter"
	"sync"
	"sync/atomic"

	"github.com/logbus/logbus/engine"
)

// Stream is a consumer whose messages arrive on a channel instead of through
// a [Handler] ([Topic.Stream]). It is a member of its group like any other
// consumer: it owns some of the group's partitions, and each of them
// delivers one message at a time (up to n with [WithKeyConcurrency], never
// two with equal keys).
//
// Every [Delivery] must be acked or nacked. Until then its partition
// delivers nothing further (per-key order; with WithKeyConcurrency, nothing
// further of its key) and its offset is not committed (at-least-once).
// Deliveries of different partitions can be outstanding at once.
//
// A delivery waiting on C that nobody has received is taken back at once
// when the group wants its partition back ([Group.Pause], [Group.Seek],
// [Group.Replay], a rebalance, [Broker.Close]): it is delivered again later
// with the same Attempt. A delivery the caller has received is waited for
// until it is acked or nacked; Pause, Seek, Replay and [Group.Leave] wait
// for it only until their ctx ends.
type Stream[V any] struct {
	group    *Group[V]
	consumer string
	ch       chan *Delivery[V]
	done     chan struct{} // closed by Close: outstanding deliveries are given back

	closeOnce sync.Once
	closeErr  error
	chOnce    sync.Once
}

// Delivery is one message handed to a [Stream]. Ack or Nack it exactly
// once; later calls do nothing, and so do calls after its Stream was closed
// without it being settled (it went back to the group).
type Delivery[V any] struct {
	Message[V]
	outcome chan error   // buffered: settling never blocks
	state   atomic.Int32 // pending, settled or abandoned: whoever moves it first decides
}

// The states of a Delivery. Settling and abandoning race (an Ack against a
// [Stream.Close]); the compare-and-swap from pending decides which one
// happened, so a settled delivery is never given back and an abandoned one
// never counts as settled.
const (
	pending int32 = iota
	settled
	abandoned
)

// Ack reports the message processed: its offset is committed and the next
// message of its partition follows. It does not block.
func (d *Delivery[V]) Ack() { d.settle(nil) }

// errNacked stands in for a nil error given to Nack.
var errNacked = errors.New("logbus: nacked")

// Nack reports the message failed with err: it counts as a failed attempt,
// so the message is retried and then dead-lettered as the group's
// [RetryPolicy] says; an err wrapping [ErrPermanent] dead-letters it at
// once. It does not block.
func (d *Delivery[V]) Nack(err error) {
	if err == nil {
		err = errNacked
	}
	d.settle(err)
}

func (d *Delivery[V]) settle(err error) {
	if d.state.CompareAndSwap(pending, settled) {
		d.outcome <- err
	}
}

// Stream joins group as consumer, like [Topic.Subscribe], and returns the
// consumer's channel of deliveries. It fails as Subscribe does.
func (t *Topic[K, V]) Stream(group, consumer string, opts ...SubscribeOption) (*Stream[V], error) {
	s := &Stream[V]{consumer: consumer, ch: make(chan *Delivery[V]), done: make(chan struct{})}
	deliver := func(ctx context.Context, msg Message[V], revoked <-chan struct{}) error {
		d := &Delivery[V]{Message: msg, outcome: make(chan error, 1)}
		select {
		case s.ch <- d:
		case <-revoked: // the group wants the partition back and nobody took d
			return engine.ErrNotDelivered
		case <-s.done:
			return giveBack(ctx, revoked, engine.ErrNotDelivered)
		case <-ctx.Done():
			return engine.ErrNotDelivered
		}
		select {
		case err := <-d.outcome:
			return err
		case <-s.done:
		case <-ctx.Done():
		}
		if d.state.CompareAndSwap(pending, abandoned) {
			return giveBack(ctx, revoked, engine.ErrAbandoned)
		}
		return <-d.outcome // settled first: its outcome is on the way, and stands
	}
	// The channel closes once the consumer left and its workers exited, so
	// nothing sends on it afterwards.
	closeCh := func() { s.chOnce.Do(func() { close(s.ch) }) }
	g, err := t.join(group, consumer, nil, deliver, closeCh, opts)
	if err != nil {
		return nil, err
	}
	s.group = g
	g.joined(consumer, s)
	return s, nil
}

// giveBack returns err, a give-back, once the group has taken the
// partition back (revoked) or Close gave up on the handlers (ctx). A
// closed Stream does not hand its partitions back by itself: its Close
// leaves the group, which revokes them. Returned before that, the give-back
// may reach a worker that still serves this consumer, and an engine that
// delivers a given-back record again at once to its owner would hand it
// straight back here, and again, until the Leave lands: each pass raising
// the delivery hooks.
func giveBack(ctx context.Context, revoked <-chan struct{}, err error) error {
	select {
	case <-revoked:
	case <-ctx.Done():
	}
	return err
}

// C returns the channel of deliveries. It is closed when the stream leaves
// its group: by [Stream.Close], by [Broker.Close], or when
// [Broker.DeleteGroup] or [Broker.DeleteTopic] deleted the group.
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
// group's remaining consumers (or to the next one to join): one the caller
// had received comes again with Attempt one higher, one still unread with
// the same Attempt. Deliveries already settled stand. C is closed when
// Close returns (when [Group.Leave] removed the stream first, once its
// deliveries ended). Close waits only for the stream's own hand-over code
// to notice, never for the caller. Close is idempotent; after
// [Broker.Close], or once the group was deleted, it does nothing.
func (s *Stream[V]) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		if !s.group.left(s.consumer, s) {
			return // Group.Leave removed it already
		}
		// The group or its topic deleted: the consumer left with it.
		err := s.group.eng.Leave(context.Background(), s.consumer)
		if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrSubscription) && !errors.Is(err, ErrTopicNotFound) {
			s.closeErr = fail(err, "close stream %q of group %q on topic %q", s.consumer, s.group.Name(), s.group.topic)
		}
	})
	return s.closeErr
}
