package core

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
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

// counterIDs is the default IDSource: a random per-broker prefix, so IDs
// from two brokers in one process differ, then a counter. It formats IDs
// 64 at a time into one string and hands out substrings of it, so an ID
// costs no allocation of its own: a Message.ID keeps its block of 64 (about
// 1.3 KiB) alive, and nothing else.
type counterIDs struct {
	prefix string

	mu    sync.Mutex // guards the fields below
	next  uint64     // the counter of the next block's first ID
	block string     // the current block's IDs, back to back
	ends  [idBlock]uint16
	taken int // IDs of block already handed out
}

const idBlock = 64

// NewIDSource returns the default IDSource: unique within the process with
// overwhelming probability, ordered within one broker.
func NewIDSource() IDSource {
	var raw [6]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails on supported platforms
	return &counterIDs{prefix: hex.EncodeToString(raw[:]) + "-", next: 1, taken: idBlock}
}

func (c *counterIDs) NextID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.taken == idBlock {
		c.refillLocked()
	}
	start := 0
	if c.taken > 0 {
		start = int(c.ends[c.taken-1])
	}
	id := c.block[start:c.ends[c.taken]]
	c.taken++
	return id
}

func (c *counterIDs) refillLocked() {
	buf := make([]byte, 0, idBlock*(len(c.prefix)+20))
	for i := range idBlock {
		buf = append(buf, c.prefix...)
		buf = strconv.AppendUint(buf, c.next, 10)
		c.next++
		c.ends[i] = uint16(len(buf))
	}
	c.block, c.taken = string(buf), 0
}
