package core

import (
	"sync"
	"sync/atomic"
	"time"
)

// ClockResolution is how often the default clock reads the time while it
// is in use: records published within one ClockResolution of each other may
// carry the same Created.
const ClockResolution = time.Millisecond

// coarseClock is the default Clock: time.Now, read once per ClockResolution
// rather than once per record. Reading the clock costs as much as the rest
// of a publish on some VMs (a kvm-clock read is ~40 ns), and a record's time
// needs no more precision than Kafka gives its timestamps.
//
// While the clock is read, a goroutine refreshes its reading every
// ClockResolution; after a ClockResolution in which nobody read it, the
// goroutine exits, so an idle broker has no timer running, and the next
// read starts it again. So a reading is never ahead of time.Now, and behind
// it by at most ClockResolution plus however long the refreshing goroutine
// waits for a CPU. Readings never go backwards. stop ends the goroutine for
// good; after it, Now is time.Now.
type coarseClock struct {
	reading atomic.Pointer[time.Time] // the latest reading; nil while nothing refreshes it
	read    atomic.Bool               // Now was called since the last refresh

	mu      sync.Mutex // serialises starting, refreshing and stopping
	stopped bool
	done    chan struct{} // closed by stop
	wg      sync.WaitGroup
}

func newCoarseClock() *coarseClock { return &coarseClock{done: make(chan struct{})} }

func (c *coarseClock) Now() time.Time {
	if t := c.reading.Load(); t != nil {
		if !c.read.Load() { // a store per refresh, not per call: the line stays shared
			c.read.Store(true)
		}
		return *t
	}
	return c.start()
}

// start takes a reading and starts the goroutine that refreshes it.
func (c *coarseClock) start() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.reading.Load(); t != nil { // another reader started it
		return *t
	}
	now := time.Now()
	if c.stopped {
		return now
	}
	c.reading.Store(&now)
	c.read.Store(true)
	c.wg.Go(c.refresh) // exits when the clock goes unread for a tick, or on stop
	return now
}

func (c *coarseClock) refresh() {
	ticker := time.NewTicker(ClockResolution)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
		case <-c.done:
			return
		}
		c.mu.Lock()
		if !c.read.Swap(false) {
			c.reading.Store(nil) // unused: let the next read start afresh
			c.mu.Unlock()
			return
		}
		now := time.Now()
		c.reading.Store(&now)
		c.mu.Unlock()
	}
}

// stop ends the refreshing goroutine and waits for it.
func (c *coarseClock) stop() {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		c.reading.Store(nil)
		close(c.done)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// systemClock is time.Now.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
