package core

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

// Clock reads the time. The broker stamps records with it, trims by age with
// it and dates dead letters with it. Waiting (backoff, BlockTimeout) uses the
// runtime's timers, which testing/synctest virtualises.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// WallClock is the default Clock.
func WallClock() Clock { return wallClock{} }

// IDSource hands out record IDs. NextID is called once per publish, from many
// goroutines at once, and must return a value it never returned before.
type IDSource interface{ NextID() string }

// counterIDs is the default IDSource: a random per-broker prefix, so IDs from
// two brokers in one process differ, then a counter. One allocation per ID.
type counterIDs struct {
	prefix []byte
	n      atomic.Uint64
}

// NewIDSource returns the default IDSource: unique within the process with
// overwhelming probability, ordered within one broker.
func NewIDSource() IDSource {
	var raw [6]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails on supported platforms
	prefix := hex.AppendEncode(nil, raw[:])
	return &counterIDs{prefix: append(prefix, '-')}
}

func (c *counterIDs) NextID() string {
	var buf [40]byte
	b := append(buf[:0], c.prefix...)
	b = strconv.AppendUint(b, c.n.Add(1), 10)
	return string(b)
}
