package kit

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// CloseGrace is how long Close waits, after its context ended and it
// cancelled the handlers' context, for the handlers to return: long enough
// for a handler that honours its context, short enough to be no more than
// scheduling to the caller. pubsub.Broker.Close promises it ("plus at most
// 10ms").
const CloseGrace = 10 * time.Millisecond

// Closer runs an engine's Close sequence once. The zero Closer is ready.
type Closer struct {
	mu   sync.Mutex
	done chan struct{} // made by the first Close, closed when its sequence returned
	err  error         // the sequence's result, written before done is closed
}

// Close runs run, the sequence, on the first call and returns its result. A later or
// concurrent call waits for the first to finish, bounded by its own ctx:
// it returns the first's result, or, when its ctx ends first, an error
// wrapping ctx's (the first goes on; Close is never cut short by a caller
// other than its own). run takes no ctx: it is given the first caller's
// by its closure.
func (c *Closer) Close(ctx context.Context, run func() error) error {
	c.mu.Lock()
	first := c.done == nil
	if first {
		c.done = make(chan struct{})
	}
	done := c.done
	c.mu.Unlock()
	if !first {
		select {
		case <-done:
			return c.err
		case <-ctx.Done():
			return fmt.Errorf("close: waiting for another Close: %w", ctx.Err())
		}
	}
	c.err = run()
	close(done)
	return c.err
}

// AwaitWorkers is the step of Close that stops the deliveries: wait (a
// wait for every worker to exit, which returns ctx's error when the ctx it
// is given ends first) runs bounded by ctx; when ctx ends first, hurry
// cancels the handlers' context and wait runs again for CloseGrace. It
// returns ctx's error when ctx ended before the workers exited, else nil;
// a handler that ignores its context may still run after it returned.
func AwaitWorkers(ctx context.Context, wait func(context.Context) error, hurry func()) error {
	if wait(ctx) == nil {
		return nil
	}
	hurry()
	grace, cancel := context.WithTimeout(context.Background(), CloseGrace)
	defer cancel()
	_ = wait(grace)
	return ctx.Err()
}

// Wait waits d and reports true, or false as soon as stop or abort is
// closed (a nil channel never is): a worker's backoff, which its stop
// signal and Close's giving up cut short.
func Wait(d time.Duration, stop, abort <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
	case <-abort:
	}
	return false
}
