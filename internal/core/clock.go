package core

import (
	"sync/atomic"
	"time"
)

// Clock reads the time. The broker stamps records with it, trims by age with
// it and dates dead letters with it. Waiting (backoff, BlockTimeout) uses the
// runtime's timers, which testing/synctest virtualises.
type Clock interface{ Now() time.Time }

// wallClock is the default Clock. It reads the wall clock at most once a
// second and adds the monotonic time elapsed since that reading, which is
// one clock read where time.Now is two (time.Since of a reading that carries
// a monotonic part reads only the monotonic clock): a third of the cost of
// stamping a record on the VMs this was measured on. The result carries a
// monotonic part like time.Now's, and differs from time.Now only by how far
// the wall clock is adjusted within a second; each second starts from a
// fresh reading.
type wallClock struct {
	base atomic.Pointer[time.Time]
}

func (c *wallClock) Now() time.Time {
	if base := c.base.Load(); base != nil {
		if elapsed := time.Since(*base); 0 <= elapsed && elapsed < time.Second {
			return base.Add(elapsed)
		}
	}
	now := time.Now()
	c.base.Store(&now)
	return now
}

// WallClock returns the default Clock: the wall clock, with a monotonic
// part, as time.Now.
func WallClock() Clock { return &wallClock{} }

// IDSource hands out record IDs. NextID is called once per publish, from
// many goroutines at once, and must return a value it never returned before.
// Without one, the broker names records by position; see recordIDs.
type IDSource interface{ NextID() string }
