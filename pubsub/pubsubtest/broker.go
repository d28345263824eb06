package pubsubtest

import (
	"context"
	"testing"
	"time"

	"github.com/logbus/logbus/pubsub"
)

// Timeouts of the helpers. They are generous because they only matter when
// something is stuck: a healthy broker drains long before. Inside a
// testing/synctest bubble they are virtual and expire at once once nothing
// else can happen, so they cost a stuck test no real time.
const (
	closeTimeout = time.Minute
	drainTimeout = time.Minute
)

// NewBroker returns a running broker built with opts, and registers a
// cleanup on tb that closes it, allowing a minute for the drain. If Close
// reports an error (a [*pubsub.ShutdownError]: records left undelivered by
// a paused group, a group whose consumers left, a drain that ran out of
// time, or a handler still running), the cleanup reports it with tb.Errorf,
// so a test that leaves work behind fails. A test that closes the broker
// itself has seen Close's result; the cleanup then does nothing.
//
// Called inside a testing/synctest bubble with the bubble's t, it builds
// the broker in the bubble and closes it there, as the bubble requires.
//
// NewBroker does not block; the cleanup blocks while the broker drains.
// Like [pubsub.NewBroker], it reports an invalid option from NewTopic.
func NewBroker(tb testing.TB, opts ...pubsub.BrokerOption) *pubsub.Broker {
	tb.Helper()
	b := pubsub.NewBroker(opts...)
	tb.Cleanup(func() {
		if b.State() == pubsub.Stopped {
			return // the test closed it and had Close's result
		}
		// Not tb.Context(): it is already done when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			tb.Errorf("pubsubtest: closing the broker at the end of the test: %v", err)
		}
	})
	return b
}

// Drain blocks until b's groups have committed every record published
// before the call, as b.Drain does, and fails the test with tb.Fatalf if
// that takes more than a minute (virtual time inside a testing/synctest
// bubble). A paused group with lag, or one whose consumers all left, fails
// it at once ([pubsub.ErrStalled]), as it fails b.Drain. Like every tb.Fatalf
// caller, Drain must be called from the goroutine
// running the test. It is safe to call concurrently with anything else on b.
func Drain(tb testing.TB, b *pubsub.Broker) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		tb.Fatalf("pubsubtest: %v", err)
	}
}
