package core

import "time"

// Clock reads the time. The broker stamps records with it, trims by age with
// it and dates dead letters with it. Waiting (backoff, BlockTimeout) uses the
// runtime's timers, which testing/synctest virtualises.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// WallClock is the default Clock.
func WallClock() Clock { return wallClock{} }

// IDSource hands out record IDs. NextID is called once per publish, from
// many goroutines at once, and must return a value it never returned before.
// Without one, the broker names records by position; see recordIDs.
type IDSource interface{ NextID() string }
