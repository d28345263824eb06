package pubsubtest

import (
	"sync"
	"time"

	"github.com/logbus/logbus/pubsub"
)

var _ pubsub.Clock = (*Clock)(nil)

// Clock is a [pubsub.Clock] that only moves when the test moves it. Pass it
// to the broker with [pubsub.WithClock].
//
// It drives what the broker reads from its Clock: Message.Created,
// Retention.MaxAge trimming and DeadLetter.FailedAt. It does not drive the
// broker's waits (retry backoff, Retention.BlockTimeout), which use the
// runtime's timers; for those use testing/synctest (see the package doc).
//
// Moving the clock wakes nothing: the broker trims records older than
// MaxAge on the partition's next publish or read, so after Advance a test
// publishes (or lets a consumer read) before it looks at TopicStats.Expired.
//
// The zero Clock reads the zero time. A Clock is safe for concurrent use:
// the broker calls Now from many goroutines while the test moves it. No
// method blocks beyond a short critical section.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until it is moved. It is safe
// for concurrent use and does not block.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start}
}

// Now returns the clock's current time. It is safe for concurrent use and
// does not block beyond a short critical section.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d; a negative d moves it back. It is
// safe for concurrent use: concurrent Advances add up. It does not block
// beyond a short critical section, and wakes nothing (see Clock).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t, forward or back. It is safe for concurrent use,
// does not block beyond a short critical section, and wakes nothing (see
// Clock).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
